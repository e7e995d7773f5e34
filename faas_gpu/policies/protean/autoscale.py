"""Container autoscaling as PROTEAN does it (§4.2), as one pluggable scaling policy.

- Reactive scale-up: one container per batch, n_c = sum_m ceil(n_r(m) / batch_size(m)), counting
  the batches running and those the waiting requests will form. A container per batch (not per
  request) keeps GPU jobs from queueing behind each other without a container per request.
- Delayed termination: containers the reactive rule finds surplus are stopped only after they
  have been surplus for a whole `surplus_window_s` (~10 minutes) without a break; the number
  stopped is the surplus that lasted the whole window (its minimum). Short dips keep their
  containers warm, which the paper credits with up to 98% fewer cold starts.

How policies compose: the provider runs ONE autoscaler loop. Each tick it builds, per function,
a `FunctionLoad` (requests waiting and arriving, batches running, containers), groups functions
by the scaling policy their annotations name, calls that policy's `observe(snapshot, now)`, and
applies the `ScaleDecision` (desired containers per function; `cold_starts` is informational).
A policy is any object with a `name` and that `observe` (the `ScalingPolicy` protocol): this
module's `ProteanScaling`, INFless's non-uniform scaling with LSTH keep-alive, a fixed policy.
Each function is governed by exactly one policy, so decisions never conflict; policies keep
their own state (here: when surplus began) and read the time only from `now`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class FunctionLoad:
    """One function (model) as the autoscaler sees it at a tick."""

    function: Hashable
    batch_size: int
    waiting_requests: int  # arrived, not yet in a running batch
    running_batches: int
    containers: int  # warm or starting
    min_containers: int = 0
    max_containers: int | None = None


@dataclass(frozen=True)
class ScaleSnapshot:
    functions: Mapping[Hashable, FunctionLoad]


@dataclass
class ScaleDecision:
    desired: dict[Hashable, int] = field(default_factory=dict)  # containers each function should have
    scale_up: dict[Hashable, int] = field(default_factory=dict)  # containers to start now
    terminate: dict[Hashable, int] = field(default_factory=dict)  # containers to stop now


class ScalingPolicy(Protocol):
    name: str

    def observe(self, snapshot: ScaleSnapshot, now: float) -> ScaleDecision: ...


def containers_needed(load: FunctionLoad) -> int:
    """The reactive rule: one container per batch, running or to be formed from waiting requests."""
    if load.batch_size <= 0:
        raise ValueError(f"{load.function}: batch_size must be > 0, got {load.batch_size}")
    return load.running_batches + math.ceil(load.waiting_requests / load.batch_size)


@dataclass
class _Surplus:
    since: float
    least: int


class ProteanScaling:
    """Reactive one-container-per-batch scale-up and delayed termination (§4.2)."""

    name = "protean"

    def __init__(self, surplus_window_s: float = 600.0):
        if surplus_window_s < 0:
            raise ValueError(f"surplus_window_s: must be >= 0, got {surplus_window_s}")
        self.surplus_window_s = surplus_window_s
        self._surplus: dict[Hashable, _Surplus] = {}

    def observe(self, snapshot: ScaleSnapshot, now: float) -> ScaleDecision:
        out = ScaleDecision()
        for fn, load in snapshot.functions.items():
            need = max(containers_needed(load), load.min_containers)
            if load.max_containers is not None:
                need = min(need, load.max_containers)
            have = load.containers
            if need >= have:
                self._surplus.pop(fn, None)
                out.desired[fn] = need
                if need > have:
                    out.scale_up[fn] = need - have
                continue
            surplus = have - need
            sp = self._surplus.get(fn)
            if sp is None:
                self._surplus[fn] = _Surplus(now, surplus)
                out.desired[fn] = have
                continue
            sp.least = min(sp.least, surplus)
            if now - sp.since >= self.surplus_window_s:
                out.terminate[fn] = sp.least
                out.desired[fn] = have - sp.least
                left = surplus - sp.least
                if left > 0:
                    self._surplus[fn] = _Surplus(now, left)
                else:
                    self._surplus.pop(fn)
            else:
                out.desired[fn] = have
        for fn in list(self._surplus):
            if fn not in snapshot.functions:
                del self._surplus[fn]
        return out
