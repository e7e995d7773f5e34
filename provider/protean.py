"""PROTEAN's autoscaling (§4.2) in the provider: one container per batch, delayed termination.

A function opts in with `com.faas-gpu.scaling: protean`. Its replicas are identical containers
that each serve one batch at a time, with the batch size the function's instances use
(`envVars.FAAS_GPU_MAX_BATCH`, else the annotation `com.faas-gpu.max-batch`). Each autoscaler
tick builds a `FunctionLoad` from what the gateway sees and applies `ProteanScaling.observe`:

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
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.contract.env import MAX_BATCH as MAX_BATCH_VAR
from faas_gpu.policies.protean import FunctionLoad, ProteanScaling, ScaleSnapshot, containers_needed

from .runtime import LaunchError
from .types import FunctionRecord, ValidationError

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
    replicas: int
    inflight: int = 0
    peak: int = 0  # most in flight since the last tick
    needed: int = 0  # containers the reactive rule asked for at the last tick
    requests: int = 0  # n_r at the last tick
    rr: itertools.count = field(default_factory=itertools.count)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ProteanFunctions:
    """The functions under PROTEAN's scaling, as one policy of the provider's autoscaler."""

    name = "protean"

    def __init__(self, runtime, *, set_replicas: Callable[[str, str, int], object], surplus_window_s: float = 600.0):
        self.runtime = runtime
        self.set_replicas = set_replicas
        self.policy = ProteanScaling(surplus_window_s)
        self._fns: dict[tuple[str, str], _State] = {}

    # -- life cycle ------------------------------------------------------------------------
    def validate(self, record: FunctionRecord) -> int:
        ann = record.deployment.annotations or {}
        for key in NOT_FOR_PROTEAN:
            if key in ann:
                raise ValidationError(
                    f"annotations: {key} applies to INFless-scaled functions; with {SCALING}: protean, containers "
                    "are kept by delayed termination (the provider's --protean-surplus-window)"
                )
        record.deployment.scale_bounds()
        return batch_size(record)

    def prepare(self, record: FunctionRecord) -> None:
        batch = self.validate(record)
        lo, hi = record.deployment.scale_bounds()
        key = record.key
        self.runtime.set_plan(*key, None)  # identical replicas, counted by record.replicas
        replicas = min(max(record.replicas, lo), hi)
        state = _State(record, batch, lo, hi, replicas)
        old = self._fns.get(key)
        if old is not None:
            with old.lock:
                state.inflight, state.peak = old.inflight, old.peak
        self._fns[key] = state
        if replicas != record.replicas:
            record.replicas = replicas  # the deploy applies this record next
            self.set_replicas(*key, replicas)

    def forget(self, key: tuple[str, str]) -> None:
        self._fns.pop(key, None)

    def manages(self, key: tuple[str, str]) -> bool:
        return key in self._fns

    # -- the hot path ----------------------------------------------------------------------
    def arrived(self, key: tuple[str, str]) -> None:
        state = self._fns.get(key)
        if state is None:
            return
        with state.lock:
            state.inflight += 1
            state.peak = max(state.peak, state.inflight)

    def departed(self, key: tuple[str, str]) -> None:
        state = self._fns.get(key)
        if state is None:
            return
        with state.lock:
            state.inflight = max(0, state.inflight - 1)

    def pick(self, key: tuple[str, str], ready: list[tuple[str, str]]) -> str | None:
        """Round robin: the containers are identical, each forms its own batches."""
        state = self._fns.get(key)
        if state is None or not ready:
            return None
        return ready[next(state.rr) % len(ready)][1]

    # -- scaling ---------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        loads: dict[tuple[str, str], FunctionLoad] = {}
        for key, state in list(self._fns.items()):
            with state.lock:
                n_r, state.peak = state.peak, state.inflight
            load = FunctionLoad(key, state.batch, n_r, 0, state.replicas, state.lo, state.hi)
            state.requests, state.needed = n_r, containers_needed(load)
            loads[key] = load
        decision = self.policy.observe(ScaleSnapshot(loads), now)
        for key, want in decision.desired.items():
            state = self._fns.get(key)
            if state is not None and want != state.replicas:
                log.info(
                    "protean: %s.%s %d -> %d replicas (%d requests in flight, batch %d)",
                    key[1],
                    key[0],
                    state.replicas,
                    want,
                    state.requests,
                    state.batch,
                )
                self._apply(state, want)

    def scale_to(self, key: tuple[str, str], n: int) -> None:
        """/system/scale-function: set now, within bounds; the next ticks judge it like any count."""
        state = self._fns.get(key)
        if state is not None:
            self._apply(state, min(max(n, state.lo), state.hi))

    def scale_from_zero(self, key: tuple[str, str]) -> bool:
        state = self._fns.get(key)
        if state is None:
            return False
        if state.replicas == 0:
            self._apply(state, max(1, state.lo))
        return True

    def _apply(self, state: _State, n: int) -> None:
        state.replicas = n
        record = self.set_replicas(*state.record.key, n)
        if isinstance(record, FunctionRecord):
            state.record = record
            try:
                self.runtime.apply(record)
            except LaunchError as exc:
                log.error("protean: cannot scale %s.%s: %s", record.name, record.namespace, exc)

    def describe(self, key: tuple[str, str]) -> dict | None:
        state = self._fns.get(key)
        if state is None:
            return None
        return {
            "name": key[1],
            "namespace": key[0],
            "policy": "protean",
            "batch": state.batch,
            "inFlight": state.inflight,
            "requests": state.requests,
            "needed": state.needed,
            "replicas": state.replicas,
            "surplusWindowS": self.policy.surplus_window_s,
            "instances": [{"id": i} for i in self.runtime.instances(*key)],
        }
