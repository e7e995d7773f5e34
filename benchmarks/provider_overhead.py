"""Latency the gateway adds to an invocation, measured against the watchdog itself.

Starts a stack on free ports with a temporary state folder, builds and deploys the `echo`
example (python3-gpu: watchdog in http mode + Flask handler), then sends the same requests,
at the same concurrency, straight to the replica's watchdog (the baseline) and through the
gateway's /function/ route, in alternating rounds so drift hits both alike.

Prints p50/p99 of both, the added latency, requests per second, and, as the last line, one
JSON object with the figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.stack_process import StackProcess  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _load(port: int, path: str, requests_per_client: int, concurrency: int) -> tuple[list[float], float]:
    """Latencies (s) of `concurrency` keep-alive clients, and the achieved requests per second."""
    latencies: list[float] = []
    lock = threading.Lock()
    body = b"hello"
    barrier = threading.Barrier(concurrency + 1)

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        barrier.wait()
        for _ in range(requests_per_client):
            t0 = time.perf_counter()
            conn.request("POST", path, body=body, headers={"Content-Type": "text/plain"})
            resp = conn.getresponse()
            data = resp.read()
            mine.append(time.perf_counter() - t0)
            if resp.status != 200 or data != body:
                raise RuntimeError(f"unexpected answer {resp.status}: {data[:200]!r}")
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return latencies, len(latencies) / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per path per round (all clients)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--warmup", type=int, default=200)
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="faas-gpu-bench-") as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "FAAS_GPU_HOME": str(home)}
        subprocess.run(
            [sys.executable, "-m", "faas_gpu.cli", "build", "-f", str(REPO / "stack.yml"), "--filter", "echo"],
            check=True,
            env=env,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
        )
        stack = StackProcess(home).start()
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "faas_gpu.cli",
                    "deploy",
                    "-f",
                    str(REPO / "stack.yml"),
                    "--filter",
                    "echo",
                    "--gateway",
                    stack.url,
                ],
                check=True,
                env=env,
                cwd=tmp,
                stdout=subprocess.DEVNULL,
            )
            stack.wait_ready("echo")
            port_file = next((home / "run").glob("openfaas-fn/echo-*/port"))
            direct_port = int(port_file.read_text())
            per_client = max(1, args.requests // args.concurrency)
            _load(direct_port, "/", args.warmup, args.concurrency)
            _load(stack.gateway_port, "/function/echo", args.warmup, args.concurrency)
            direct: list[float] = []
            gateway: list[float] = []
            direct_rps: list[float] = []
            gateway_rps: list[float] = []
            for _ in range(args.rounds):
                lat, rps = _load(direct_port, "/", per_client, args.concurrency)
                direct += lat
                direct_rps.append(rps)
                lat, rps = _load(stack.gateway_port, "/function/echo", per_client, args.concurrency)
                gateway += lat
                gateway_rps.append(rps)
        finally:
            stack.stop()

    ms = 1000.0
    fig = {
        "concurrency": args.concurrency,
        "requests": len(direct),
        "direct_p50_ms": _percentile(direct, 50) * ms,
        "direct_p99_ms": _percentile(direct, 99) * ms,
        "gateway_p50_ms": _percentile(gateway, 50) * ms,
        "gateway_p99_ms": _percentile(gateway, 99) * ms,
        "direct_rps": statistics.mean(direct_rps),
        "gateway_rps": statistics.mean(gateway_rps),
    }
    fig["added_p50_ms"] = fig["gateway_p50_ms"] - fig["direct_p50_ms"]
    fig["added_p99_ms"] = fig["gateway_p99_ms"] - fig["direct_p99_ms"]
    fig["gateway_to_direct_p50_ratio"] = fig["gateway_p50_ms"] / fig["direct_p50_ms"]
    fig["gateway_to_direct_rps_ratio"] = fig["gateway_rps"] / fig["direct_rps"]
    fig = {k: round(v, 4) if isinstance(v, float) else v for k, v in fig.items()}

    print(f"echo (python3-gpu), {fig['requests']} requests per path, concurrency {args.concurrency}")
    print(f"{'path':<10}{'p50 ms':>10}{'p99 ms':>10}{'rps':>10}")
    print(f"{'direct':<10}{fig['direct_p50_ms']:>10.3f}{fig['direct_p99_ms']:>10.3f}{fig['direct_rps']:>10.0f}")
    print(f"{'gateway':<10}{fig['gateway_p50_ms']:>10.3f}{fig['gateway_p99_ms']:>10.3f}{fig['gateway_rps']:>10.0f}")
    print(
        f"added by the gateway: p50 {fig['added_p50_ms']:.3f} ms (goal <= 1 ms), p99 {fig['added_p99_ms']:.3f} ms; "
        f"gateway/direct p50 x{fig['gateway_to_direct_p50_ratio']:.2f}, rps x{fig['gateway_to_direct_rps_ratio']:.2f}"
    )
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
