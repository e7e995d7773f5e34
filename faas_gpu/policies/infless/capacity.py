"""What one instance can take: Eq. 1 of INFless, and the feasibility rule of Algorithm 1.

A request waits in its instance's batch queue until the batch fills or times out, then runs for
t_exec. The SLO holds when waiting + running <= t_slo, so the batch timeout is t_slo - t_exec;
no request is dropped when batches are submitted no faster than they run (rate <= r_up), and
batches fill before the timeout when the rate is at least r_low:

    r_up  = floor(1 / t_exec) * b
    r_low = ceil(1 / (t_slo - t_exec)) * b,   with t_exec <= t_slo / 2 for b > 1

A batch of one never waits: it needs only t_exec <= t_slo, and any rate up to r_up fits it
(r_low = 0).

The batch timeout when the serving path is counted (issue 20). t_exec then carries the path's
predicted time for the batch, `path_s` (`with_path`), and the timeout keeps a margin for it:

    timeout = t_slo - t_exec - PATH_MARGIN * path_s

The paper's timeout leaves no slack: a batch that waited its full timeout meets the SLO only if
it runs exactly as predicted. The model's own time is steady, but the path's (gateway, scheduler,
GPU Manager, the processes sharing the node's cores) varied 2-3x with the neighbours' load on the
measuring machine, and the scheduler answers 504 for a job whose deadline has passed, so such a
batch is work done and thrown away. PATH_MARGIN = 1 leaves room for the path to run twice as slow
as profiled (or for the batch to wait behind the path part of the one ahead of it). r_low counts
the same slack (batches fill before the shorter timeout), so a large batch is feasible only where
the load fills it within it. With no path (path_s = 0) both are the paper's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.8  # §3.2: how far below R_max the load may fall before instances are released
PATH_MARGIN = 1.0  # the batch timeout leaves this many more times the path's predicted time for its variance


@dataclass(frozen=True)
class Candidate:
    """A configuration the latency predictor vouches for: batch, CPU cores, GPU share (% of SMs)."""

    batch: int
    cpu: float
    gpu: float
    t_exec_s: float
    path_s: float = 0.0
    """The part of t_exec that is the serving path's (`with_path`), for the timeout's margin."""


@dataclass(frozen=True)
class Bounds:
    r_low: float
    r_up: float


def bounds(t_exec_s: float, t_slo_s: float, batch: int, path_s: float = 0.0) -> Bounds:
    """Eq. 1. The floor/ceil are the paper's: rates are whole batches per whole second; the slack
    for r_low is the batch timeout (`batch_timeout_s`, the paper's when path_s = 0)."""
    if t_exec_s <= 0 or t_slo_s <= 0 or batch < 1:
        raise ValueError(f"bounds: need t_exec > 0, t_slo > 0, batch >= 1 (got {t_exec_s}, {t_slo_s}, {batch})")
    r_up = math.floor(1.0 / t_exec_s) * batch
    if batch == 1:
        return Bounds(0.0, float(r_up))
    slack = t_slo_s - t_exec_s - PATH_MARGIN * path_s
    r_low = math.ceil(1.0 / slack) * batch if slack > 0 else math.inf
    return Bounds(float(r_low), float(r_up))


def batch_timeout_s(t_exec_s: float, t_slo_s: float, batch: int, path_s: float = 0.0) -> float:
    """How long an instance's batch queue waits for a full batch: t_slo - t_exec, less
    PATH_MARGIN * path_s when t_exec includes the path's path_s (0 for b = 1)."""
    return 0.0 if batch == 1 else max(0.0, t_slo_s - t_exec_s - PATH_MARGIN * path_s)


def feasible(c: Candidate, t_slo_s: float, residual_rps: float) -> bool:
    """AvailableConfig of Algorithm 1 for one configuration."""
    if c.batch == 1:
        return c.t_exec_s <= t_slo_s and math.floor(1.0 / c.t_exec_s) >= 1
    if c.t_exec_s > t_slo_s / 2:
        return False
    b = bounds(c.t_exec_s, t_slo_s, c.batch, c.path_s)
    return b.r_up > 0 and residual_rps >= b.r_low
