"""Closed-loop load for the benchmarks: `callers` threads each calling in a loop, and the best
throughput whose p99 latency meets an SLO. One place, so that every benchmark's "SLO-bound
throughput" is measured the same way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

CALLERS = (1, 2, 4, 8, 16, 32, 64)


def closed_loop(call: Callable[[], object], callers: int, seconds: float) -> tuple[float, list[float]]:
    """(calls/s, each call's latency in s) of `callers` threads calling `call()` for `seconds`."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def caller() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            call()
            with lock:
                lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lat) / (time.perf_counter() - t0), lat


def p99(lat: list[float]) -> float:
    ordered = sorted(lat)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("inf")


def slo_throughput(call: Callable[[], object], slo_s: float, seconds: float) -> tuple[float, float, int]:
    """The best closed-loop throughput whose p99 latency meets the SLO, over 1..64 callers
    (more callers stop being tried once p99 misses it): (calls/s, p99 s, callers)."""
    best = (0.0, 0.0, 0)
    for callers in CALLERS:
        rps, lat = closed_loop(call, callers, seconds)
        tail = p99(lat)
        if tail > slo_s:
            break
        if rps > best[0]:
            best = (rps, tail, callers)
    return best
