"""faas-gpu watchdog: of-watchdog's contract (0.11.6) and the classic watchdog's, in Python.

Modes (env `mode`): `http` forks `fprocess` once and proxies every request to `upstream_url`;
`streaming` and `serializing` fork per request (body on stdin, CGI environment); `classic`
is the classic watchdog (combined output, `Forking fprocess.` / `Wrote N Bytes` log lines).

Our additions, each because several replicas share one host here: `metrics_port` (of-watchdog
hard-codes 8081; `0` disables it), `bind_address` (default 0.0.0.0), `max_body_bytes` (413 above
it), and in http mode `/_/ready` answers 503 until the upstream accepts connections, so a
runtime knows the handler has loaded.

Run: `python fwatchdog.py`; `python fwatchdog.py -run-healthcheck` exits 0 iff the lock exists.
Only the standard library, plus prometheus_client when the metrics server is on. This file is the
entry point (the image's CMD, the name the runtimes find the process by); the parts are in
`faas_gpu_watchdog/` beside it, one role per module.
"""

from __future__ import annotations

import os
import sys
import tempfile

from faas_gpu_watchdog.config import Config
from faas_gpu_watchdog.watchdog import serve


def main(argv: list[str]) -> int:
    if "-run-healthcheck" in argv[1:]:
        return 0 if os.path.exists(os.path.join(tempfile.gettempdir(), ".lock")) else 1
    serve(Config(dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
