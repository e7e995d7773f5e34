"""The experiments run on the INFless simulation: stress testing (Fig. 11) and the patterns'
load curves (Fig. 12-14)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from faas_gpu.policies.infless import Server

from .metrics import RunResult
from .model import Function
from .simulation import simulate


@dataclass
class StressPoint:
    rps_per_fn: float
    result: RunResult

    @property
    def total_rps(self) -> float:
        return self.rps_per_fn * len(self.result.fns)


def max_sustained(
    functions: Sequence[Function],
    servers: Sequence[Server],
    system: str,
    *,
    warmup_s: int = 20,
    measure_s: int = 20,
    tolerance: float = 0.01,
    **kw,
) -> StressPoint:
    """The largest constant load (the same RPS for every function) served with no SLO violation
    once warm (stress testing, Fig. 11), found by doubling then bisection to `tolerance`."""

    def run(rps: float) -> RunResult:
        loads = {f.name: [rps] * (warmup_s + measure_s) for f in functions}
        return simulate(functions, loads, servers, system, measure_from=warmup_s, **kw)

    def ok(r: RunResult) -> bool:
        return r.total("requests") - r.total("good") <= 1e-6 * r.total("requests")

    lo, lo_res, hi = 0.0, None, 8.0
    while True:
        res = run(hi)
        if not ok(res):
            break
        lo, lo_res, hi = hi, res, hi * 2
        if hi > 1e7:
            raise RuntimeError(f"{system}: no saturation below 1e7 RPS")
    while hi - lo > tolerance * max(lo, 1.0):
        mid = (lo + hi) / 2
        res = run(mid)
        if ok(res):
            lo, lo_res = mid, res
        else:
            hi = mid
    if lo_res is None:
        lo_res = run(lo) if lo > 0 else run(hi)
    return StressPoint(lo, lo_res)


def pattern_loads(means: Sequence[float], peak_rps: float, hold_s: int = 10, points: int | None = None) -> list[float]:
    """A pattern's 10-minute means scaled so that its peak is `peak_rps`, each held `hold_s` seconds
    (as the authors' load generator replays them: 300 RPS peak, 10 s per point)."""
    pts = list(means[:points] if points else means)
    top = max(pts) if pts else 0.0
    scale = peak_rps / top if top > 0 else 0.0
    return [m * scale for m in pts for _ in range(hold_s)]
