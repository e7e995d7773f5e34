"""Latency the gateway adds to an invocation, measured against the watchdog itself.

Starts a stack on free ports with a temporary state folder, builds and deploys the `echo`
example (python3-gpu: watchdog in http mode + Flask handler), then sends the same requests,
at the same concurrency, straight to the replica's watchdog (the baseline) and through the
gateway's /function/ route, in alternating rounds so drift hits both alike.

Two stacks run side by side, one with the gateway's per-call records on (metrics and the
status page's activity; the default, and the figures under today's keys) and one with them off
(`--no-metrics`, keys ending `_metrics_off`); their rounds are interleaved, the order flipped each
round. `metrics_on_vs_off_p50_ratio` is the added p50 with records over that without (issue 17's
cost: within 1.05), `metrics_cost_p50_ms` the difference in ms.

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


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _start(tmp: Path, name: str, *stack_args: str) -> tuple[StackProcess, int]:
    """A stack in its own state folder with `echo` built, deployed and ready; and the replica's port."""
    home = Path(tmp) / name
    env = {**os.environ, "FAAS_GPU_HOME": str(home)}
    cli = [sys.executable, "-m", "faas_gpu.cli"]
    subprocess.run(
        [*cli, "build", "-f", str(REPO / "stack.yml"), "--filter", "echo"],
        check=True,
        env=env,
        cwd=tmp,
        stdout=subprocess.DEVNULL,
    )
    stack = StackProcess(home, *stack_args).start()
    try:
        subprocess.run(
            [*cli, "deploy", "-f", str(REPO / "stack.yml"), "--filter", "echo", "--gateway", stack.url],
            check=True,
            env=env,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
        )
        stack.wait_ready("echo")
        port_file = next((home / "run").glob("openfaas-fn/echo-*/port"))
        return stack, int(port_file.read_text())
    except BaseException:
        stack.stop()
        raise


def _figures(direct: list[float], gateway: list[float], direct_rps: list[float], gateway_rps: list[float]) -> dict:
    ms = 1000.0
    fig = {
        "direct_p50_ms": _percentile(direct, 50) * ms,
        "direct_p99_ms": _percentile(direct, 99) * ms,
        "gateway_p50_ms": _percentile(gateway, 50) * ms,
        "gateway_p99_ms": _percentile(gateway, 99) * ms,
        "direct_rps": statistics.mean(direct_rps),
        "gateway_rps": statistics.mean(gateway_rps),
    }
    fig["added_p50_ms"] = fig["gateway_p50_ms"] - fig["direct_p50_ms"]
    fig["added_p99_ms"] = fig["gateway_p99_ms"] - fig["direct_p99_ms"]
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per path per round (all clients)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--warmup", type=int, default=200)
    args = p.parse_args(argv)

    variants = ("on", "off")  # the gateway's per-call records (metrics, activity) on, and off (--no-metrics)
    samples = {v: ([], [], [], []) for v in variants}  # direct, gateway latencies; direct, gateway rps
    with tempfile.TemporaryDirectory(prefix="faas-gpu-bench-") as tmp:
        stacks: dict[str, tuple[StackProcess, int]] = {}
        try:
            stacks["on"] = _start(Path(tmp), "home-on")
            stacks["off"] = _start(Path(tmp), "home-off", "--no-metrics")
            per_client = max(1, args.requests // args.concurrency)
            for stack, direct_port in stacks.values():
                _load(direct_port, "/", args.warmup, args.concurrency)
                _load(stack.gateway_port, "/function/echo", args.warmup, args.concurrency)
            for i in range(args.rounds):
                # interleaved, the order flipped each round, so drift on a shared machine hits both alike
                for v in variants if i % 2 == 0 else variants[::-1]:
                    stack, direct_port = stacks[v]
                    direct, gateway, direct_rps, gateway_rps = samples[v]
                    lat, rps = _load(direct_port, "/", per_client, args.concurrency)
                    direct += lat
                    direct_rps.append(rps)
                    lat, rps = _load(stack.gateway_port, "/function/echo", per_client, args.concurrency)
                    gateway += lat
                    gateway_rps.append(rps)
        finally:
            for stack, _ in stacks.values():
                stack.stop()

    on, off = _figures(*samples["on"]), _figures(*samples["off"])
    fig = {"concurrency": args.concurrency, "requests": len(samples["on"][0]), **on}  # today's keys: metrics on
    fig["gateway_to_direct_p50_ratio"] = on["gateway_p50_ms"] / on["direct_p50_ms"]
    fig["gateway_to_direct_rps_ratio"] = on["gateway_rps"] / on["direct_rps"]
    fig.update({f"{k}_metrics_off": v for k, v in off.items()})
    # a ratio of differences: None where the gateway added nothing measurable without metrics (at p99
    # on a shared machine the replica's own tail can outweigh the hop)
    for q in ("p50", "p99"):
        base = off[f"added_{q}_ms"]
        fig[f"metrics_on_vs_off_{q}_ratio"] = on[f"added_{q}_ms"] / base if base > 0 else None
    fig["metrics_cost_p50_ms"] = on["added_p50_ms"] - off["added_p50_ms"]
    fig = {k: round(v, 4) if isinstance(v, float) else v for k, v in fig.items()}

    print(f"echo (python3-gpu), {fig['requests']} requests per path and stack, concurrency {args.concurrency}")
    print(f"{'path':<22}{'p50 ms':>10}{'p99 ms':>10}{'rps':>10}")
    for v, f in (("on", on), ("off", off)):
        print(
            f"{'direct, metrics ' + v:<22}{f['direct_p50_ms']:>10.3f}{f['direct_p99_ms']:>10.3f}"
            f"{f['direct_rps']:>10.0f}"
        )
        print(
            f"{'gateway, metrics ' + v:<22}{f['gateway_p50_ms']:>10.3f}{f['gateway_p99_ms']:>10.3f}"
            f"{f['gateway_rps']:>10.0f}"
        )
    print(
        f"added by the gateway: p50 {fig['added_p50_ms']:.3f} ms (goal <= 1 ms), p99 {fig['added_p99_ms']:.3f} ms; "
        f"gateway/direct p50 x{fig['gateway_to_direct_p50_ratio']:.2f}, rps x{fig['gateway_to_direct_rps_ratio']:.2f}"
    )
    print(
        f"metrics off: added p50 {fig['added_p50_ms_metrics_off']:.3f} ms, "
        f"p99 {fig['added_p99_ms_metrics_off']:.3f} ms; "
        f"on/off added p50 x{_ratio(fig['metrics_on_vs_off_p50_ratio'])} (goal <= 1.05), "
        f"p99 x{_ratio(fig['metrics_on_vs_off_p99_ratio'])}"
    )
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
