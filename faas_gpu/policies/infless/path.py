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

The path is a node resource. Its processes (gateway, watchdog, scheduler, GPU Manager, the
handler's client) are shared by every instance on the node, so a second instance does not bring
a second path: Eq. 1 alone would add its r_up as if it did. Algorithm 1 therefore reserves the
path's CPU on the node beside each instance's own cores (`Server.cpu_free`): an instance serving
r requests a second at batch b takes c + r * cpu_per_request(b) cores, with

    cpu_per_request(b) = cpu_fixed / b + cpu_per_item

and its r_up is cut to what the cores left pay for (`path_rate`). Instances beyond the node's CPU
get no rate and are not placed; a larger batch pays the fixed part over more requests, so it
serves more per core. `faas-gpu profile --path` measures time at saturation, not CPU; unless CPU
seconds are given (`cpu_fixed_s`, `cpu_per_item_s`) the path's seconds count as CPU seconds:
at saturation on a CPU-bound node the path's time per batch is the CPU it holds.

An observed shortfall is answered in that order (`corrections`): first the path's CPU on the node
is made dearer (fewer instances, larger batches: what a shortfall from instances sharing the path
needs); the per-batch time (the model) is slowed only once that lever is spent or when no path
cost is known. Slowing the per-batch time shrinks the batches Eq. 1 allows, the wrong lever while
instances are what the node cannot pay for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .capacity import Candidate

SHORTFALL = 0.85  # observed below this fraction of the prediction: the model is corrected and the function re-planned
MAX_STEP = 4.0  # the most one observation moves the correction, either way
HEADROOM = 1.25  # a saturated function asks for this much more than its plan serves
QUEUED_PER_SLOT = 2.0  # requests in flight per batch slot above which the instances count as saturated
MAX_CORRECTION = 4.0  # the most either correction (path CPU, model time) may reach in all


@dataclass(frozen=True)
class PathCost:
    """Seconds the path adds to one batch of b requests: fixed + b * per_item."""

    fixed_s: float = 0.0
    per_item_s: float = 0.0
    cpu_fixed_s: float | None = None
    """CPU seconds the path's processes spend per batch, on the node's cores (None: fixed_s)."""
    cpu_per_item_s: float | None = None
    """CPU seconds the path's processes spend per request (None: per_item_s)."""

    def __post_init__(self) -> None:
        parts = (self.fixed_s, self.per_item_s, self.cpu_fixed_s or 0.0, self.cpu_per_item_s or 0.0)
        if not all(p >= 0 for p in parts):
            raise ValueError(f"path cost: seconds must be >= 0, got {parts}")

    def batch_s(self, batch: int) -> float:
        return self.fixed_s + batch * self.per_item_s

    def cpu_per_request_s(self, batch: int) -> float:
        """Core-seconds of the node's CPU one request takes on the path at batch `batch`."""
        fixed = self.fixed_s if self.cpu_fixed_s is None else self.cpu_fixed_s
        per = self.per_item_s if self.cpu_per_item_s is None else self.cpu_per_item_s
        return fixed / max(1, batch) + per

    def cpu_scaled(self, factor: float) -> PathCost:
        """The same path with its CPU cost `factor` times dearer (the node-level correction)."""
        fixed = self.fixed_s if self.cpu_fixed_s is None else self.cpu_fixed_s
        per = self.per_item_s if self.cpu_per_item_s is None else self.cpu_per_item_s
        return replace(self, cpu_fixed_s=fixed * factor, cpu_per_item_s=per * factor)

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
    """The candidate as the whole path serves it: t_exec -> (t_exec + path) * factor; `path_s`
    keeps the path's part (for the batch timeout's margin)."""
    p = path.batch_s(c.batch) if path is not None else 0.0
    f = max(1.0, factor)
    return replace(c, t_exec_s=(c.t_exec_s + p) * f, path_s=c.path_s + p * f)


def path_rate(c: Candidate, r_up: float, cpu_free: float, path: PathCost | None) -> float:
    """The rate an instance of `c` may be given on a node with `cpu_free` cores free: its r_up, cut
    to what the cores left after its own (`c.cpu`) pay the path for, in whole batches a second
    (Eq. 1's rounding). 0 when nothing is left. No path cost: r_up."""
    if path is None:
        return r_up
    per = path.cpu_per_request_s(c.batch)
    if per <= 0:
        return r_up
    left = cpu_free - c.cpu
    if left <= 1e-9:
        return 0.0
    return min(r_up, math.floor(left / per / c.batch + 1e-9) * c.batch)


def corrections(
    path_factor: float, model_factor: float, step: float, *, path_known: bool, limit: float = MAX_CORRECTION
) -> tuple[float, float]:
    """One observed `step` (from `correction`) applied to the two levers: (path CPU factor, model
    time factor), each within [1, limit].

    A shortfall (step > 1) makes the path's CPU on the node dearer first: the plan then has fewer
    instances and larger batches, which is what a node whose path is shared needs. Only what that
    lever cannot take (it reached `limit`, or no path cost is known) slows the model's per-batch
    time. A surplus (step < 1) takes back the model's correction first, then the path's."""
    path_factor, model_factor = max(1.0, path_factor), max(1.0, model_factor)
    if step > 1:
        if path_known:
            moved = min(limit, path_factor * step)
            step /= moved / path_factor
            path_factor = moved
        model_factor = min(limit, model_factor * max(1.0, step))
    elif step < 1:
        moved = max(1.0, model_factor * step)
        step /= moved / model_factor
        model_factor = moved
        path_factor = max(1.0, path_factor * min(1.0, step))
    return path_factor, model_factor


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


def demand(
    rps: float, r_max: float, saturated: bool, observed: float | None = None, *, headroom: float = HEADROOM
) -> float:
    """The load to plan for. Requests queueing in front of the instances mean more is offered than
    they serve, whatever the arrival rate says: callers that wait for their answers (a closed
    loop) arrive only as fast as they are served, so the rate alone never exceeds what is served.
    Queueing asks for `headroom` over what the instances serve: the plan's prediction `r_max`, or
    the capacity `observed` at saturation when that is more. A model that under-predicts (a path
    cost profiled in a slow moment; a correction never goes below 1 to take it back) must not
    leave the ask at the plan's own figure, which the callers already exceed: run 39 of the path
    limit kept batch 1, predicted 198 rps, under 8 callers served 288 while batch 8 was predicted
    to serve 455."""
    if not saturated:
        return rps
    return max(rps, headroom * max(r_max, observed or 0.0))
