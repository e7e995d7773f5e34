"""Cost of PROTEAN's request reordering (strict EDF first, bounded best-effort wait) per request.

An open-loop stream at `--rps` (5,000 by default, the paper's vision rate), half strict with
SLOs of 100-400 ms and half best-effort, goes through the scheduler's `ClassQueue` under a
virtual clock: every request is pushed on arrival and popped when a server frees, with service
slower than arrivals for the first half of the run (a backlog of thousands builds, as under
overload) and faster after (it drains). The baseline is a FIFO (`collections.deque`) fed the
same stream in the same run. Wall time is measured around the queue operations only.

Prints microseconds per request (push + pop) for both, the ratio, the CPU share that reordering
takes at `--rps`, and as its last line one JSON object with `reorder_us_per_request`,
`fifo_us_per_request`, `reorder_vs_fifo`, `max_backlog` and `cpu_share_at_rps`.
Goal: < 1 ms per request at 5,000 requests/s.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.policies.protean.classes import ClassQueue  # noqa: E402


def stream(n: int, rps: float, seed: int) -> list[tuple[float, float | None]]:
    """(arrival, deadline or None) for n requests, Poisson at `rps`, half strict."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rps)
        out.append((t, t + rng.uniform(0.1, 0.4) if rng.random() < 0.5 else None))
    return out


def service_times(n: int, rps: float) -> list[float]:
    """When each pop happens: 20% slower than arrivals for the first half, 40% faster after."""
    slow, fast = 1.0 / (rps * 0.8), 1.0 / (rps * 1.4)
    times, t = [], 0.0
    for i in range(n):
        t += slow if i < n // 2 else fast
        times.append(t)
    return times


def run(reqs: list[tuple[float, float | None]], pops: list[float], reorder: bool) -> tuple[float, int]:
    """Seconds spent in queue operations, and the largest backlog."""
    q: ClassQueue[int] | deque[int] = ClassQueue(be_max_wait_s=1.0) if reorder else deque()
    i, backlog, spent = 0, 0, 0.0
    for now in pops:
        t0 = time.perf_counter()
        while i < len(reqs) and reqs[i][0] <= now:
            arrival, deadline = reqs[i]
            if reorder:
                q.push(i, arrival, deadline)  # type: ignore[union-attr]
            else:
                q.append(i)  # type: ignore[union-attr]
            i += 1
        if q:
            q.pop(now) if reorder else q.popleft()  # type: ignore[union-attr, call-arg]
        spent += time.perf_counter() - t0
        backlog = max(backlog, len(q))
    return spent, backlog


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rps", type=float, default=5000.0)
    ap.add_argument("--seconds", type=float, default=60.0, help="virtual seconds of traffic")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    n = int(args.rps * args.seconds)
    reqs = stream(n, args.rps, args.seed)
    pops = service_times(n, args.rps)
    best: dict[bool, float] = {}
    backlog = 0
    for _ in range(3):
        for reorder in (False, True):
            spent, b = run(reqs, pops, reorder)
            best[reorder] = min(best.get(reorder, float("inf")), spent)
            backlog = max(backlog, b)
    reorder_us, fifo_us = best[True] / n * 1e6, best[False] / n * 1e6
    cpu_share = reorder_us * 1e-6 * args.rps
    print(f"# {n:,} requests at {args.rps:,.0f} req/s (half strict), backlog up to {backlog:,}")
    print(f"ClassQueue (strict EDF, bounded BE wait): {reorder_us:.2f} us/request (push + pop)")
    print(f"FIFO baseline (deque):                    {fifo_us:.2f} us/request")
    print(f"ratio: x{reorder_us / fifo_us:.1f} the FIFO; {100 * cpu_share:.2f}% of one core at {args.rps:,.0f} req/s")
    print(f"goal < 1 ms per request: {'met' if reorder_us < 1000 else 'NOT met'}")
    print(
        json.dumps(
            {
                "reorder_us_per_request": round(reorder_us, 3),
                "fifo_us_per_request": round(fifo_us, 3),
                "reorder_vs_fifo": round(reorder_us / fifo_us, 2),
                "max_backlog": backlog,
                "cpu_share_at_rps": round(cpu_share, 5),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
