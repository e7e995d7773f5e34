"""The serving path's own cost in INFless's capacity model, and the correction by what is observed.

INFless's Eq. 1 sizes an instance from the model's execution time alone. On faas-gpu a batch also
crosses the gateway, the watchdog, the in-container client, the scheduler, the GPU Manager and the
worker: a per-request part (every request crosses the gateway, the watchdog and the handler) and
a per-batch part (one job to the scheduler, the manager and the worker per batch). `faas-gpu
profile --path` measures both on the node at saturation (`PathCost.fit` over batch sizes), and a
batch of b then occupies the path for

    t_path(b) = t_exec(b) + fixed + b * per_item

which replaces t_exec in Eq. 1 and in Algorithm 1's feasibility (`with_path`). At batch 1 the
fixed part dominates and r_up falls to what the path really serves; large batches amortise it.

What the model still misses (processes sharing cores, another function's load) shows as an
observed capacity below the prediction: the throughput the function's instances reach while
requests queue in front of them (`observed_capacity`). `correction` turns the shortfall into a
factor on t_path, so the next plan is made with the node's real speed (`with_path(..., factor)`);
a capacity observed above the prediction takes an earlier correction back (never below 1). The
queueing itself asks for more than the plan serves (`demand`): callers that wait for their answers
arrive only as fast as they are served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .capacity import Candidate

SHORTFALL = 0.85  # observed below this fraction of the prediction: the model is corrected and the function re-planned
MAX_STEP = 4.0  # the most one observation moves the correction, either way
HEADROOM = 1.25  # a saturated function asks for this much more than its plan serves
QUEUED_PER_SLOT = 2.0  # requests in flight per batch slot above which the instances count as saturated


@dataclass(frozen=True)
class PathCost:
    """Seconds the path adds to one batch of b requests: fixed + b * per_item."""

    fixed_s: float = 0.0
    per_item_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.fixed_s >= 0 and self.per_item_s >= 0):
            raise ValueError(
                f"path cost: fixed and per-item seconds must be >= 0, got {self.fixed_s}, {self.per_item_s}"
            )

    def batch_s(self, batch: int) -> float:
        return self.fixed_s + batch * self.per_item_s

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> PathCost:
        """Least squares over (batch size, path seconds per batch) points; one point: all of it fixed.

        A negative intercept or slope (noise) is clipped to 0 and the other part refitted."""
        pts = [(float(b), float(s)) for b, s in points]
        if not pts or any(b < 1 or s < 0 for b, s in pts):
            raise ValueError(f"path cost: need points (batch >= 1, seconds >= 0), got {points!r}")
        xs = {b for b, _ in pts}
        if len(xs) == 1:
            b0 = next(iter(xs))
            mean = sum(s for _, s in pts) / len(pts)
            return cls(0.0, mean / b0) if b0 > 1 else cls(mean, 0.0)
        n = len(pts)
        mx, my = sum(b for b, _ in pts) / n, sum(s for _, s in pts) / n
        sxx = sum((b - mx) ** 2 for b, _ in pts)
        slope = sum((b - mx) * (s - my) for b, s in pts) / sxx
        intercept = my - slope * mx
        if slope < 0:
            return cls(max(0.0, my), 0.0)
        if intercept < 0:
            return cls(0.0, sum(b * s for b, s in pts) / sum(b * b for b, _ in pts))
        return cls(intercept, slope)


def with_path(c: Candidate, path: PathCost | None, factor: float = 1.0) -> Candidate:
    """The candidate as the whole path serves it: t_exec -> (t_exec + path) * factor."""
    t = c.t_exec_s + (path.batch_s(c.batch) if path is not None else 0.0)
    return replace(c, t_exec_s=t * max(1.0, factor))


def observed_capacity(done_rps: float, in_flight: float, batch_slots: int) -> float | None:
    """The function's throughput at saturation, or None when it is not saturated.

    Saturated: more requests in flight than the instances' batches hold, `QUEUED_PER_SLOT` times
    over, so they queue in front of the instances and what they complete is what they can do."""
    if done_rps <= 0 or batch_slots < 1:
        return None
    return done_rps if in_flight > QUEUED_PER_SLOT * batch_slots else None


def correction(
    predicted_rps: float, observed_rps: float | None, *, shortfall: float = SHORTFALL, max_step: float = MAX_STEP
) -> float | None:
    """The factor on t_path that brings the prediction to what was observed, or None when the
    observation is within `shortfall` of the prediction either way (or there is none).

    Above 1: the path is slower than predicted; below 1: faster (a correction made earlier, in a
    worse moment, is taken back). One step moves by at most `max_step` either way, so a single
    bad window (a cold start, a neighbour's burst) cannot throw the model far."""
    if observed_rps is None or predicted_rps <= 0 or observed_rps <= 0:
        return None
    if shortfall * predicted_rps <= observed_rps <= predicted_rps / shortfall:
        return None
    return min(max_step, max(1.0 / max_step, predicted_rps / observed_rps))


def demand(rps: float, r_max: float, saturated: bool, *, headroom: float = HEADROOM) -> float:
    """The load to plan for. Requests queueing in front of the instances mean more is offered than
    they serve, whatever the arrival rate says: callers that wait for their answers (a closed
    loop) arrive only as fast as they are served, so the rate alone never exceeds the plan."""
    return max(rps, headroom * r_max) if saturated else rps
