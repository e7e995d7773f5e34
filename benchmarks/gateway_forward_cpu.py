"""The gateway process's CPU per forwarded call, against a trivial function (issue 20).

Starts a stack on free ports (local runtime, temporary state folder), deploys an http-mode
function whose handler is a bare `http.server` answering a fixed 40-byte body, and sends
`--calls` POSTs through `/function/` from `--clients` keep-alive callers. The figure is the
stack's gunicorn master and worker's utime + stime (/proc, all threads; the replicas, children
of the worker, are not counted) over the measured calls: what the gateway spends per call, its forward
to the replica included. The baseline, measured over the same calls: the replica's watchdog, a
proxy hop of its own (http mode: read the call, forward it to the handler, answer), so
`gateway_vs_watchdog_hop` says what the gateway's hop costs against the plainest hop on the path.
`--rounds` repeats the measurement on the same stack.

    .venv/bin/python benchmarks/gateway_forward_cpu.py [--calls 3000] [--clients 4] [--rounds 3]

Last line: one JSON object {gateway_cpu_ms_per_call: [per round], median,
watchdog_cpu_ms_per_call: [per round], gateway_vs_watchdog_hop (median ratio), rps: [per round]}.
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

from faas_gpu.sandbox import LAUNCHER  # noqa: E402
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


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for p in pids:
        fields = _stat(p)
        total += int(fields[11]) + int(fields[12])
    return total


def gateway_pids(pid: int) -> list[int]:
    """The stack's gunicorn master and its worker (the gateway): the master's direct children;
    the replicas, the worker's children, are not counted."""
    return [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]


def watchdog_pids(gateway: list[int]) -> list[int]:
    """The replica's watchdog: a process running fwatchdog.py whose parent is the gateway's (started
    by any of their threads, so found by parent pid, not by the main thread's children file) or
    the replica's launcher, the gateway's child (`faas_gpu.sandbox`)."""
    parents = set(gateway)
    found = []
    for launched in (False, True):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if int(_stat(int(entry.name))[1]) not in parents:
                    continue
                if not launched and os.fsencode(LAUNCHER) in cmdline:
                    parents.add(int(entry.name))
                elif launched and b"fwatchdog" in cmdline:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


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
            gateway = gateway_pids(s.proc.pid)
            watchdog = watchdog_pids(gateway)
            if len(watchdog) != 1:
                raise RuntimeError(f"expected one replica watchdog under the gateway, found {watchdog}")
            per_call, hop, rps = [], [], []
            for _ in range(args.rounds):
                t0, c0, w0 = time.perf_counter(), cpu_ticks(gateway), cpu_ticks(watchdog)
                load(s.gateway_port, args.calls, args.clients)
                wall = time.perf_counter() - t0
                per_call.append(round((cpu_ticks(gateway) - c0) / hz / args.calls * 1000, 3))
                hop.append(round((cpu_ticks(watchdog) - w0) / hz / args.calls * 1000, 3))
                rps.append(round(args.calls / wall))
                print(
                    f"gateway CPU {per_call[-1]:.3f} ms/call, its replica's watchdog {hop[-1]:.3f} "
                    f"(x{per_call[-1] / hop[-1]:.2f}) at {rps[-1]} calls/s",
                    flush=True,
                )
        finally:
            s.stop()
    ratio = statistics.median(g / w for g, w in zip(per_call, hop, strict=True) if w)
    figures = {"gateway_cpu_ms_per_call": per_call, "median": statistics.median(per_call)}
    figures.update(watchdog_cpu_ms_per_call=hop, gateway_vs_watchdog_hop=round(ratio, 3), rps=rps)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
