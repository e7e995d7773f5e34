"""The provider's one autoscaler: it looks each function's scaling policy up once and delegates.

A function's policy is chosen at deploy (`policy_for`): `com.faas-gpu.scaling` when set, else
HarmonyBatch for a function that declares apps, INFless for one that names a model, plain
OpenFaaS replicas for the rest. From then on every moment of the function goes to that policy:
its requests (`arrived`, `pick`, `departed`), each period's decision (`tick`), scale requests
(`scale_to`) and requests at zero (`scale_from_zero`). The router keeps, per function, the
policy, its state, the load meter and what the runtime runs, and applies each decision the one
way decisions are applied (a per-instance plan, or a count of identical replicas), so a new
policy is a module and never another branch here. Each function is governed by exactly one
policy, so decisions never conflict.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.datastore import DatastoreUnavailable
from faas_gpu.policies.scale_zero import holds

from ..runtime import InstanceSpec, LaunchError, Runtime
from ..types import FunctionRecord, ValidationError
from .base import Key, LoadMeter, ScalingContext, ScalingDecision, ScalingPolicy
from .harmony import APPS
from .infless_spec import MODEL, SLO
from .protean import SCALING
from .replicas import InvocationRateRule, PlainReplicas

log = logging.getLogger(__name__)

SCALING_POLICIES = annotation_keys.SCALING_POLICIES


def scaling_of(record: FunctionRecord) -> str | None:
    """The one policy that scales a function: `com.faas-gpu.scaling` when set, else harmonybatch
    for a function that declares apps, infless for one that names a model, None for the rest."""
    ann = record.deployment.annotations or {}
    raw = ann.get(SCALING)
    if raw is None:
        return "harmonybatch" if APPS in ann else "infless" if MODEL in ann else None
    name = raw.strip().lower()
    if name not in SCALING_POLICIES:
        raise ValidationError(f"annotations: {SCALING} must be one of {', '.join(SCALING_POLICIES)}, got {raw!r}")
    if name == "infless" and MODEL not in ann:
        raise ValidationError(f"annotations: {SCALING}: infless needs {MODEL} and {SLO}")
    if name == "harmonybatch" and APPS not in ann:
        raise ValidationError(f"annotations: {SCALING}: harmonybatch needs {APPS}")
    if name != "harmonybatch" and APPS in ann:
        raise ValidationError(
            f"annotations: {APPS} declares HarmonyBatch apps but {SCALING} is {name!r}: a function has one scaling "
            "policy"
        )
    return name


@dataclass
class _Governed:
    """One function under its policy: what the policy returned last, and what the runtime runs."""

    policy: ScalingPolicy
    record: FunctionRecord
    state: Any
    meter: LoadMeter
    replicas: int
    instances: tuple[InstanceSpec, ...] | None = None
    active_at: float = 0.0
    """When a call last arrived or was in flight (or the function was deployed): `idle_s`."""
    arrivals_seen: int = 0


class ScalingRouter:
    def __init__(
        self,
        runtime: Runtime,
        policies: Iterable[ScalingPolicy],
        *,
        set_replicas: Callable[[str, str, int], object],
        period_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        alert_rule: InvocationRateRule | None = None,
    ):
        """`set_replicas` stores a function's desired replicas (the store's; it returns the record);
        `alert_rule` autoscales plain functions as OpenFaaS CE's alert does (None: they are not)."""
        self.runtime = runtime
        self.set_replicas = set_replicas
        self.period_s = period_s
        self.clock = clock
        self.plain = PlainReplicas(alert_rule)
        self.policies: dict[str, ScalingPolicy] = {p.name: p for p in policies}
        self.policies.setdefault(self.plain.name, self.plain)
        self._fns: dict[Key, _Governed] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def policy(self, name: str) -> ScalingPolicy | None:
        return self.policies.get(name)

    def policy_for(self, record: FunctionRecord) -> ScalingPolicy:
        """The function's policy; one this provider does not run leaves it plain replicas."""
        return self.policies.get(scaling_of(record) or self.plain.name, self.plain)

    # -- deploy-time ------------------------------------------------------------------------
    def validate(self, record: FunctionRecord) -> None:
        """Refuse annotations the function's policy cannot run (the deploy answers 400)."""
        self.policy_for(record).validate(record)

    def prepare(self, record: FunctionRecord) -> None:
        """Before the runtime applies a deploy: the function's policy adopts it and its first
        decision is applied (a policy it leaves forgets it, once the new one took it)."""
        key = record.key
        policy = self.policy_for(record)
        with self._lock:
            old = self._fns.get(key)
            previous = old.state if old is not None and old.policy is policy else None
            decision = policy.adopt(record, self.clock(), previous)
            if old is not None and old.policy is not policy:
                old.policy.forget(key, deleted=False)
            meter = old.meter if old is not None else LoadMeter()
            now = self.clock()
            entry = _Governed(policy, record, decision.state, meter, record.replicas, active_at=now)
            entry.arrivals_seen = meter.read().arrivals
            self._fns[key] = entry
            if decision.instances is not None:
                self._run_plan(entry, decision)
            else:
                self.runtime.set_plan(*key, None)  # identical replicas, counted by record.replicas
                entry.replicas = decision.replicas
                if decision.replicas != record.replicas:
                    record.replicas = decision.replicas  # the deploy applies this record next
                    self.set_replicas(*key, decision.replicas)

    def forget(self, key: Key) -> None:
        """A deleted function: every policy drops what it kept (one may hold a plan from a
        provider run before this one)."""
        with self._lock:
            self._fns.pop(key, None)
            for policy in self.policies.values():
                policy.forget(key, deleted=True)

    def manages(self, key: Key) -> bool:
        """Whether a faas-gpu policy (not plain replicas) scales the function and picks its instances."""
        entry = self._fns.get(key)
        return entry is not None and entry.policy.managed

    # -- the hot path -----------------------------------------------------------------------
    def arrived(self, key: Key, headers: dict[str, str] | None = None) -> None:
        """Count an arrival (HarmonyBatch: per app, BadApp when its app header names none)."""
        entry = self._fns.get(key)
        if entry is None:
            return
        entry.meter.arrive(entry.policy.arrived(key, entry.state, headers))

    def departed(self, key: Key, status: int | None = None) -> None:
        """A request counted by `arrived` was answered (`status`) or failed (PROTEAN counts those
        in flight, plain replicas' alert rule the 200s)."""
        entry = self._fns.get(key)
        if entry is not None:
            entry.meter.depart(status)

    def pick(self, key: Key, ready: list[tuple[str, str]], headers: dict[str, str] | None = None) -> str | None:
        entry = self._fns.get(key)
        if entry is None:
            return None
        return entry.policy.pick(entry.state, ready, headers)

    # -- requests of OpenFaaS ----------------------------------------------------------------
    def scale_to(self, key: Key, n: int) -> bool:
        """/system/scale-function (already clamped to the function's bounds): the policy says what
        it means for the function, and it is applied. False: no policy governs the function (its
        policy refused it after a restart), so the caller applies the count itself."""
        with self._lock:
            entry = self._fns.get(key)
            if entry is None:
                return False
            self._apply(entry, entry.policy.scale_to(self._context(entry, self.clock()), n), force=True)
            return True

    def scale_from_zero(self, key: Key) -> bool:
        """A call found no ready replica: the policy starts what serves it (the call is demand)."""
        with self._lock:
            entry = self._fns.get(key)
            if entry is None:
                return False
            now = self.clock()
            entry.active_at = now
            self._apply(entry, entry.policy.scale_from_zero(self._context(entry, now)), force=False)
            return True

    def describe(self, key: Key) -> dict | None:
        """The policy's view; a policy of identical replicas lists the runtime's."""
        entry = self._fns.get(key)
        if entry is None:
            return None
        described = entry.policy.describe(self._context(entry, self.clock()))
        if described is not None and "instances" not in described:
            described["instances"] = [{"id": i} for i in self.runtime.instances(*key)]
        return described

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autoscaler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.tick()
            except DatastoreUnavailable as exc:  # an outage: one line a tick, not a traceback
                log.warning("autoscaler tick skipped: %s", exc)
            except Exception:  # a datastore restart must not end autoscaling
                log.exception("autoscaler tick failed")

    def tick(self) -> None:
        """Each function's periodic decision, applied where it changes what runs."""
        now = self.clock()
        with self._lock:
            for entry in list(self._fns.values()):
                ctx = self._context(entry, now, new_period=True)
                self._apply(entry, self._held(entry, ctx, entry.policy.decide(ctx)), force=False)

    def _held(self, entry: _Governed, ctx: ScalingContext, decision: ScalingDecision) -> ScalingDecision:
        """A decision that would leave nothing running under calls in flight (waiting at the gateway
        for a replica, or being served) is the policy's answer to a call at zero instead: whatever
        a policy's keep-alive says, those calls are demand (`scale_zero.holds`)."""
        if decision.replicas >= holds(ctx.load.in_flight):
            return decision
        log.info("%s.%s: %d calls in flight: kept from zero", ctx.record.name, ctx.record.namespace, ctx.load.in_flight)
        return entry.policy.scale_from_zero(replace(ctx, state=decision.state, replicas=0))

    def _context(self, entry: _Governed, now: float, *, new_period: bool = False) -> ScalingContext:
        load = entry.meter.read(new_period=new_period)
        if load.arrivals != entry.arrivals_seen or load.in_flight > 0 or load.peak_in_flight > 0:
            entry.active_at, entry.arrivals_seen = now, load.arrivals
        idle_s = max(0.0, now - entry.active_at)
        return ScalingContext(entry.record, load, entry.replicas, now, entry.state, idle_s)

    # -- applying decisions ------------------------------------------------------------------
    def _apply(self, entry: _Governed, decision: ScalingDecision, *, force: bool) -> None:
        """Apply what changed (everything, for a scale request: the stored count is the policy's)."""
        entry.state = decision.state
        if decision.instances is not None:
            if force or decision.instances != entry.instances:
                self._run_plan(entry, decision)
        elif force or decision.replicas != entry.replicas:
            self._resize(entry, decision.replicas)

    def _run_plan(self, entry: _Governed, decision: ScalingDecision) -> None:
        assert decision.instances is not None
        key = entry.record.key
        entry.instances, entry.replicas = decision.instances, decision.replicas
        self.runtime.set_plan(*key, list(decision.instances))
        entry.policy.applied(key, decision.state)
        self.set_replicas(*key, decision.replicas)

    def _resize(self, entry: _Governed, n: int) -> None:
        key = entry.record.key
        entry.instances, entry.replicas = None, n
        record = self.set_replicas(*key, n)
        if isinstance(record, FunctionRecord):
            entry.record = record
            try:
                self.runtime.apply(record)
            except LaunchError as exc:  # the runtime keeps the record, retries it and shows why
                log.error("cannot scale %s.%s: %s", record.name, record.namespace, exc)
