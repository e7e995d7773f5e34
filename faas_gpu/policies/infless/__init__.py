"""INFless (ASPLOS '22): built-in non-uniform batching, greedy scaling and LSTH keep-alive.

Pure policies, driven by the provider's autoscaler and by `faas_gpu.sim.infless` alike:
- `capacity`: an instance's request-rate bounds [r_low, r_up] and batch timeout (Eq. 1);
- `dispatch`: the three cases of §3.2 (rates per instance, scale up, release) and the
  weighted splitter that sends requests in those proportions;
- `schedule`: Algorithm 1, greedy non-uniform scaling by resource efficiency (Eq. 10);
- `keepalive`: LSTH (§3.5), the hybrid-histogram policy (HHP), a fixed keep-alive, the
  `warm` rule that applies their windows, and `keepalive_policy` (the annotation's policy);
- `path`: the serving path's cost (fixed + per-item, measured by `faas-gpu profile --path`) added
  to t_exec, its CPU reserved on the node (`path_rate`), and the corrections by the capacity
  observed at saturation (`corrections`: the path's CPU first, the model's time last);
- `replan`: when a re-plan may restart instances (`restart_pays`), which batches the arrivals
  fill within their timeout (`fills`), a plan they no longer fill (`underfilled`), and
  corrections fading back to 1 (`decayed`);
- `rate`: the arrival rate the provider scales on (`RateWindow`, built by `rate_window`).
"""

from .capacity import ALPHA, Bounds, Candidate, batch_timeout_s, bounds, feasible
from .dispatch import DispatchDecision, InstanceLoad, WeightedSplitter, dispatch
from .keepalive import (
    FixedKeepAlive,
    HybridHistogram,
    KeepAlivePolicy,
    LongShortTermHistogram,
    Windows,
    keepalive_policy,
    warm,
)
from .path import PathCost, correction, corrections, demand, observed_capacity, path_rate, with_path
from .rate import RateWindow, rate_window
from .replan import decayed, fills, restart_pays, underfilled
from .schedule import Placement, ScheduleResult, Server, beta_from_flops, efficiency, schedule

__all__ = [
    "ALPHA",
    "Bounds",
    "Candidate",
    "DispatchDecision",
    "FixedKeepAlive",
    "HybridHistogram",
    "InstanceLoad",
    "KeepAlivePolicy",
    "LongShortTermHistogram",
    "Placement",
    "RateWindow",
    "ScheduleResult",
    "PathCost",
    "Server",
    "WeightedSplitter",
    "Windows",
    "batch_timeout_s",
    "beta_from_flops",
    "bounds",
    "correction",
    "decayed",
    "corrections",
    "demand",
    "dispatch",
    "efficiency",
    "feasible",
    "fills",
    "keepalive_policy",
    "observed_capacity",
    "path_rate",
    "rate_window",
    "restart_pays",
    "underfilled",
    "schedule",
    "warm",
    "with_path",
]
