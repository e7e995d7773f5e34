"""PROTEAN's autoscaling (§4.2) in the provider: one container per batch, delayed termination.

A function opts in with `com.faas-gpu.scaling: protean`. Its replicas are identical containers
that each serve one batch at a time, with the batch size the function's instances use
(`envVars.FAAS_GPU_MAX_BATCH`, else the annotation `com.faas-gpu.max-batch`). Each autoscaler
decision builds a `FunctionLoad` from what the gateway saw and applies `ProteanScaling.observe`:

- n_r (the requests to serve) is the most requests of the function in flight at the gateway
  since the last tick, answered or not: a burst that came and went within a tick still counts,
  and the gateway cannot tell a request waiting in an instance's batch queue from one in a
  running batch, so `running_batches` is folded into it;
- containers are the function's desired replicas; `com.openfaas.scale.min` / `.max` bound them.

Containers the rule finds surplus go only after they stayed surplus for the whole surplus window
(`--protean-surplus-window`, ~10 minutes as in the paper): that is these functions' keep-alive,
in place of INFless's LSTH (which does not apply to them).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.contract.env import MAX_BATCH as MAX_BATCH_VAR
from faas_gpu.policies.protean import FunctionLoad, ProteanScaling, ScaleSnapshot, containers_needed
from faas_gpu.policies.scale_zero import ScaleToZero

from ..types import FunctionRecord, ValidationError
from ..validation import zero_after_s
from .base import Key, ScalingContext, ScalingDecision

log = logging.getLogger(__name__)

SCALING = annotation_keys.SCALING
MAX_BATCH = annotation_keys.MAX_BATCH
BATCH_ENV = MAX_BATCH_VAR.name
NOT_FOR_PROTEAN = (annotation_keys.KEEP_ALIVE, annotation_keys.SCALE_ZERO)


def batch_size(record: FunctionRecord) -> int:
    """The batch the function's instances form: envVars win over the annotation, as in their env."""
    env = record.deployment.envVars or {}
    ann = record.deployment.annotations or {}
    if BATCH_ENV in env:
        where, raw = f"envVars.{BATCH_ENV}", env[BATCH_ENV]
    elif MAX_BATCH in ann:
        where, raw = f"annotations: {MAX_BATCH}", ann[MAX_BATCH]
    else:
        raise ValidationError(
            f"annotations: {SCALING}: protean starts one container per batch; set {MAX_BATCH} "
            f"(or envVars.{BATCH_ENV}) to the function's batch size"
        )
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValidationError(f"{where} must be a whole batch size, got {raw!r}") from None
    if value < 1:
        raise ValidationError(f"{where} must be at least 1, got {raw!r}")
    return value


@dataclass
class _State:
    record: FunctionRecord
    batch: int
    lo: int
    hi: int
    scaling: ProteanScaling
    """The paper's rule with its surplus timer: kept across updates, like the replicas it judges."""
    needed: int = 0  # containers the reactive rule asked for at the last decision
    requests: int = 0  # n_r at the last decision
    rr: itertools.count = field(default_factory=itertools.count)


class ProteanFunctions:
    """PROTEAN's one container per batch with delayed termination, as a scaling policy."""

    name = "protean"
    managed = True

    def __init__(self, *, surplus_window_s: float = 600.0):
        self.surplus_window_s = surplus_window_s
        ProteanScaling(surplus_window_s)  # refuses a negative window now, not at the first deploy

    # -- life cycle ------------------------------------------------------------------------
    def validate(self, record: FunctionRecord) -> None:
        self._batch(record)

    def _batch(self, record: FunctionRecord) -> int:
        ann = record.deployment.annotations or {}
        for key in NOT_FOR_PROTEAN:
            if key in ann:
                raise ValidationError(
                    f"annotations: {key} applies to INFless-scaled functions; with {SCALING}: protean, containers "
                    "are kept by delayed termination (the provider's --protean-surplus-window)"
                )
        record.deployment.scale_bounds()
        return batch_size(record)

    def adopt(self, record: FunctionRecord, now: float, previous: _State | None) -> ScalingDecision:
        """Identical replicas, counted by record.replicas within com.openfaas.scale.min/max."""
        batch = self._batch(record)
        lo, hi = record.deployment.scale_bounds()
        scaling = previous.scaling if previous is not None else ProteanScaling(self.surplus_window_s)
        state = _State(record, batch, lo, hi, scaling)
        return ScalingDecision(state, min(max(record.replicas, lo), hi))

    def forget(self, key: Key, *, deleted: bool) -> None:
        """Nothing is kept outside the state the router holds."""

    # -- the hot path ----------------------------------------------------------------------
    def arrived(self, key: Key, state: _State, headers: dict[str, str] | None) -> str | None:
        return None  # the meter's in-flight count is this policy's input

    def pick(self, state: _State, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        """Round robin: the containers are identical, each forms its own batches."""
        if not ready:
            return None
        return ready[next(state.rr) % len(ready)][1]

    # -- decisions -------------------------------------------------------------------------
    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        """n_r is the most requests in flight since the last decision (see the module's docstring)."""
        state: _State = ctx.state
        key = ctx.record.key
        n_r = ctx.load.peak_in_flight
        load = FunctionLoad(key, state.batch, n_r, 0, ctx.replicas, state.lo, state.hi)
        state.requests, state.needed = n_r, containers_needed(load)
        want = state.scaling.observe(ScaleSnapshot({key: load}), ctx.now).desired[key]
        zero = zero_after_s(ctx.record.deployment.labels)  # OpenFaaS Pro's scale to zero, on top
        if zero is not None and ctx.replicas > 0 and ScaleToZero(zero).idle(ctx.idle_s, ctx.load.in_flight):
            want = 0
        if want != ctx.replicas:
            log.info(
                "protean: %s.%s %d -> %d replicas (%d requests in flight, batch %d)",
                key[1],
                key[0],
                ctx.replicas,
                want,
                n_r,
                state.batch,
            )
        return ScalingDecision(state, want)

    def scale_to(self, ctx: ScalingContext, n: int) -> ScalingDecision:
        """Set now, within bounds; the next decisions judge it like any count."""
        state: _State = ctx.state
        if n == 0 and zero_after_s(ctx.record.deployment.labels) is not None:
            return ScalingDecision(state, 0)  # the provider API's scale to zero of a scale-zero function
        return ScalingDecision(state, min(max(n, state.lo), state.hi))

    def scale_from_zero(self, ctx: ScalingContext) -> ScalingDecision:
        state: _State = ctx.state
        return ScalingDecision(state, max(1, state.lo) if ctx.replicas == 0 else ctx.replicas)

    def applied(self, key: Key, state: _State) -> None:
        """Replica counts live in the function's record: nothing else to keep."""

    def describe(self, ctx: ScalingContext) -> dict | None:
        state: _State = ctx.state
        key = ctx.record.key
        return {
            "name": key[1],
            "namespace": key[0],
            "policy": "protean",
            "batch": state.batch,
            "inFlight": ctx.load.in_flight,
            "requests": state.requests,
            "needed": state.needed,
            "replicas": ctx.replicas,
            "surplusWindowS": self.surplus_window_s,
        }
