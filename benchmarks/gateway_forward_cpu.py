"""The gateway process's CPU per forwarded call, against a trivial function (issue 20).

Starts a stack on free ports (local runtime, temporary state folder), deploys an http-mode
function whose handler is a bare `http.server` answering a fixed 40-byte body, and sends
`--calls` POSTs through `/function/` from `--clients` keep-alive callers. The figure is the
stack's gunicorn master and worker's utime + stime (/proc, all threads; the replicas, children
of the worker, are not counted) over the measured calls: what the gateway spends per call, its forward
to the replica included. `--rounds` repeats the measurement on the same stack.

    .venv/bin/python benchmarks/gateway_forward_cpu.py [--calls 3000] [--clients 4] [--rounds 3]

Last line: one JSON object {gateway_cpu_ms_per_call: [per round], median, rps: [per round]}.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.stack_process import StackProcess  # noqa: E402

HANDLER = (
    "python3 -c \"import os, http.server as h; port = int(os.environ['upstream_url'].rsplit(':', 1)[1]); "
    "B = h.BaseHTTPRequestHandler; B.protocol_version = 'HTTP/1.1'; B.log_message = lambda *a: None\n"
    "def do_POST(self):\n"
    "    self.rfile.read(int(self.headers.get('Content-Length') or 0))\n"
    '    body = b\'{\\"answer\\": 42, \\"label\\": \\"cat\\", \\"ok\\": 1}\'\n'
    "    self.send_response(200); self.send_header('Content-Type', 'application/json')\n"
    "    self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
    "B.do_POST = do_POST; h.ThreadingHTTPServer(('127.0.0.1', port), B).serve_forever()\""
)


def cpu_ticks(pid: int) -> int:
    """The stack's gunicorn master and its worker (the gateway): the master's direct children;
    the replicas, the worker's children, are not counted."""
    total = 0
    for p in [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def load(port: int, calls: int, clients: int) -> None:
    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in range(n):
            conn.request(
                "POST", "/function/trivial", body=b'{"seed": %d}' % i, headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{resp.status}: {data[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=client, args=(calls // clients,)) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=300)
    args = ap.parse_args()
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory() as tmp:
        s = StackProcess(Path(tmp) / "home").start()
        try:
            body = {"service": "trivial", "image": "x", "envProcess": HANDLER, "envVars": {"mode": "http"}}
            s.request("POST", "/system/functions", json=body, timeout=10).raise_for_status()
            s.wait_ready("trivial")
            load(s.gateway_port, args.warmup, args.clients)
            per_call, rps = [], []
            for _ in range(args.rounds):
                t0, c0 = time.perf_counter(), cpu_ticks(s.proc.pid)
                load(s.gateway_port, args.calls, args.clients)
                wall, cpu_s = time.perf_counter() - t0, (cpu_ticks(s.proc.pid) - c0) / hz
                per_call.append(round(cpu_s / args.calls * 1000, 3))
                rps.append(round(args.calls / wall))
                print(f"gateway CPU {per_call[-1]:.3f} ms/call at {rps[-1]} calls/s", flush=True)
        finally:
            s.stop()
    print(json.dumps({"gateway_cpu_ms_per_call": per_call, "median": statistics.median(per_call), "rps": rps}))


if __name__ == "__main__":
    main()
