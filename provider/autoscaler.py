"""The provider's autoscaler: it drives INFless's pure policies for the functions that name a model.

A function is managed when its annotations name the model to predict (`com.faas-gpu.model`) and
an SLO (`com.faas-gpu.slo-ms`). Every period the autoscaler measures the function's arrival rate,
asks the dispatcher (`dispatch`) how to split it over the function's instances, adds instances
with Algorithm 1 (`schedule`) for the residual load or releases surplus ones, and hands the rates
to the gateway's weighted splitter. Each instance is a replica with its own batch size, batch
timeout (t_slo - t_exec), CPU threads and GPU share (the runtime's per-instance plans). With
the annotation `com.faas-gpu.scale-zero: "true"` the keep-alive policy (LSTH by default) also takes an idle
function to zero and starts it again before the arrival it predicts. `com.openfaas.scale.min`
and `com.openfaas.scale.max` bound everything.

This is the one autoscaler of the provider: other scaling policies plug in as policy objects
here, not as a second loop. Three do: INFless (this module, the default for a function that
names a model), HarmonyBatch pools (`harmony.py`, for a function that declares apps) and PROTEAN's
one container per batch (`protean.py`, opted into with `com.faas-gpu.scaling: protean`). Each
function is governed by exactly one of them (`scaling_of`), so their decisions never conflict.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore, DatastoreUnavailable
from faas_gpu.history import InvocationHistory
from faas_gpu.policies.infless import (
    Candidate,
    FixedKeepAlive,
    HybridHistogram,
    InstanceLoad,
    KeepAlivePolicy,
    LongShortTermHistogram,
    Server,
    WeightedSplitter,
    dispatch,
    schedule,
)
from faas_gpu.policies.infless.capacity import batch_timeout_s, bounds

from .config import parse_duration
from .harmony import APPS, HarmonyPools
from .protean import SCALING, ProteanFunctions
from .runtime.local import InstanceSpec
from .types import FunctionRecord, ValidationError

log = logging.getLogger(__name__)

PLANS_PREFIX = keys.INSTANCES
MODEL = annotation_keys.MODEL
SLO = annotation_keys.SLO_MS
BEST_EFFORT = annotation_keys.BEST_EFFORT
KEEP_ALIVE = annotation_keys.KEEP_ALIVE
SCALE_ZERO = annotation_keys.SCALE_ZERO  # CE refuses com.openfaas.scale.zero; this is our own scaler's
SCALING_POLICIES = annotation_keys.SCALING_POLICIES
MIN_AGE_S = 10.0  # an instance serves this long before it may be released (no flapping)
PANIC_WINDOW_S = 1.0


class Predictor(Protocol):
    def configs(self, model: str, gpu: bool = False) -> list[tuple[int, int, int, float]]:
        """Every profiled (batch, cpu threads, gpu share %, predicted ms); LookupError when none."""


@dataclass(frozen=True)
class FunctionPolicy:
    """What a function's annotations and labels ask of the autoscaler."""

    model: str
    slo_s: float
    best_effort: bool
    keepalive: KeepAlivePolicy
    scale_zero: bool
    min_instances: int
    max_instances: int

    @classmethod
    def of(cls, record: FunctionRecord) -> FunctionPolicy | None:
        ann = record.deployment.annotations or {}
        if MODEL not in ann:
            return None
        model = ann[MODEL].strip()
        if not model:
            raise ValidationError(f"annotations: {MODEL} must name a profiled model")
        raw = ann.get(SLO)
        if raw is None:
            raise ValidationError(f"annotations: {SLO} is required with {MODEL} (the latency SLO in ms)")
        try:
            slo_ms = float(raw)
        except ValueError:
            raise ValidationError(f"annotations: {SLO} must be a number of milliseconds, got {raw!r}") from None
        if not math.isfinite(slo_ms) or slo_ms <= 0:
            raise ValidationError(f"annotations: {SLO} must be positive, got {raw!r}")
        lo, hi = record.deployment.scale_bounds()
        return cls(
            model,
            slo_ms / 1000.0,
            _flag(ann, BEST_EFFORT),
            _keepalive(ann.get(KEEP_ALIVE, "lsth")),
            _flag(ann, SCALE_ZERO),
            lo,
            hi,
        )


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


def _flag(values: dict[str, str], key: str) -> bool:
    raw = values.get(key, "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise ValidationError(f"{key}: must be true or false, got {values[key]!r}")
    return raw in ("true", "1")


def _keepalive(raw: str) -> KeepAlivePolicy:
    """`lsth` (default), `hhp`, or a fixed window such as `300s` / `fixed:5m`."""
    text = raw.strip().lower()
    if text == "lsth":
        return LongShortTermHistogram()
    if text == "hhp":
        return HybridHistogram()
    try:
        return FixedKeepAlive(parse_duration(text.removeprefix("fixed:"), KEEP_ALIVE))
    except ValueError:
        raise ValidationError(f"annotations: {KEEP_ALIVE} must be lsth, hhp or a duration, got {raw!r}") from None


@dataclass
class Instance:
    id: str
    candidate: Candidate
    r_low: float
    r_up: float
    timeout_s: float
    server: str
    gpu_index: int | None
    created: float
    rate: float = 0.0

    def env(self, slo_s: float) -> dict[str, str]:
        c = self.candidate
        env = {
            "FAAS_GPU_MAX_BATCH": str(c.batch),
            "FAAS_GPU_BATCH_TIMEOUT_MS": f"{self.timeout_s * 1000:.3f}",
            "FAAS_GPU_CPU_THREADS": str(max(1, int(c.cpu))),
            "FAAS_GPU_SLO_MS": f"{slo_s * 1000:g}",
        }
        if c.gpu:
            env["FAAS_GPU_GPU_SHARE"] = str(int(c.gpu))
        return env

    def to_json(self) -> dict:
        c = self.candidate
        return {
            "id": self.id,
            "batch": c.batch,
            "cpu": c.cpu,
            "gpuShare": c.gpu,
            "tExecMs": round(c.t_exec_s * 1000, 3),
            "rLow": self.r_low,
            "rUp": self.r_up,
            "batchTimeoutMs": round(self.timeout_s * 1000, 3),
            "rate": round(self.rate, 3),
            "server": self.server,
        }

    @classmethod
    def from_json(cls, d: dict, now: float) -> Instance:
        c = Candidate(int(d["batch"]), float(d["cpu"]), float(d["gpuShare"]), float(d["tExecMs"]) / 1000)
        return cls(
            d["id"], c, float(d["rLow"]), float(d["rUp"]), float(d["batchTimeoutMs"]) / 1000, d["server"], None, now
        )


@dataclass
class _State:
    record: FunctionRecord
    policy: FunctionPolicy
    instances: list[Instance] = field(default_factory=list)
    splitter: WeightedSplitter = field(default_factory=WeightedSplitter)
    arrivals: int = 0
    samples: deque = field(default_factory=lambda: deque(maxlen=64))
    rps: float = 0.0
    case: str = "steady"
    last_arrival: float | None = None
    windows: tuple[float, float] = (0.0, 0.0)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Autoscaler:
    def __init__(
        self,
        runtime,
        datastore: Datastore,
        history: InvocationHistory,
        predictor: Predictor,
        *,
        set_replicas: Callable[[str, str, int], object],
        cpus: float,
        gpus: int = 0,
        node: str = "local",
        period_s: float = 1.0,
        window_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        harmony: HarmonyPools | None = None,
        protean: ProteanFunctions | None = None,
    ):
        self.runtime = runtime
        self.ds = datastore
        self.history = history
        self.predictor = predictor
        self.set_replicas = set_replicas
        self.cpus, self.gpus, self.node = cpus, gpus, node
        self.period_s, self.window_s = period_s, window_s
        self.clock, self.wall = clock, wall
        self.harmony = harmony  # functions that declare applications (HarmonyBatch groups)
        self.protean = protean or ProteanFunctions(runtime, set_replicas=set_replicas)  # scaling: protean
        self._fns: dict[tuple[str, str], _State] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- deploy-time ------------------------------------------------------------------------
    def candidates(self, policy: FunctionPolicy) -> list[Candidate]:
        try:
            rows = self.predictor.configs(policy.model, gpu=self.gpus > 0)
        except LookupError as exc:
            raise ValidationError(f"annotations: {MODEL}: {exc.args[0] if exc.args else exc}") from None
        return [Candidate(b, c, g, ms / 1000.0) for b, c, g, ms in rows if c <= self.cpus and (g == 0 or self.gpus)]

    def validate(self, record: FunctionRecord) -> FunctionPolicy | None:
        """Refuse a model without a profile, or an SLO below the model's best predicted latency."""
        kind = scaling_of(record)
        if kind == "protean":
            self.protean.validate(record)
            return None
        if kind == "harmonybatch" and self.harmony is not None:
            self.harmony.validate(record)
            return None
        policy = FunctionPolicy.of(record)
        if policy is None:
            return None
        cands = self.candidates(policy)
        if not cands:
            raise ValidationError(
                f"annotations: {MODEL}: model {policy.model!r} has no profiled configuration that fits this node "
                f"({self.cpus:g} CPUs, {self.gpus} GPUs); profile it with `faas-gpu profile`"
            )
        fastest = min((c for c in cands if c.batch == 1), key=lambda c: c.t_exec_s, default=None)
        if fastest is None:
            raise ValidationError(f"annotations: {MODEL}: model {policy.model!r} has no batch-1 profile")
        if fastest.t_exec_s > policy.slo_s and not policy.best_effort:
            raise ValidationError(
                f"annotations: {SLO}: {policy.slo_s * 1000:g} ms is below the smallest predicted latency of model "
                f"{policy.model!r}: {fastest.t_exec_s * 1000:.1f} ms (batch 1, {fastest.cpu:g} CPU); raise the SLO "
                f'or set {BEST_EFFORT}: "true"'
            )
        return policy

    def prepare(self, record: FunctionRecord) -> None:
        """Before the runtime applies a deploy: managed functions get their instance plan first."""
        key = record.key
        kind = scaling_of(record)
        if kind == "protean":
            with self._lock:
                old = self._fns.pop(key, None)
                if self.harmony is not None:
                    self.harmony.forget(key)
                self.protean.prepare(record)
            if old is not None:
                self.ds.delete(PLANS_PREFIX + f"{key[0]}/{key[1]}")
            return
        if kind == "harmonybatch" and self.harmony is not None:
            with self._lock:
                self._fns.pop(key, None)
                self.protean.forget(key)
                self.harmony.prepare(record, self.clock())
            return
        policy = self.validate(record)
        with self._lock:
            self.protean.forget(key)
            if self.harmony is not None:
                self.harmony.forget(key)
            old = self._fns.get(key)
            if policy is None:
                if old is not None:
                    self._fns.pop(key)
                    self.runtime.set_plan(*key, None)
                return
            state = _State(record, policy)
            if old is not None and old.policy == policy:
                state.instances, state.splitter = old.instances, old.splitter
                state.samples, state.arrivals, state.last_arrival = old.samples, old.arrivals, old.last_arrival
            else:
                saved = self._load(key) if old is None else []
                state.instances = saved or self._fresh(state, max(policy.min_instances, record.replicas))
            self._fns[key] = state
            self._publish(state)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._fns.pop(key, None)
            self.protean.forget(key)
            if self.harmony is not None:
                self.harmony.forget(key)
        self.ds.delete(PLANS_PREFIX + f"{key[0]}/{key[1]}")
        self.history.forget(f"{key[0]}/{key[1]}")

    def manages(self, key: tuple[str, str]) -> bool:
        return key in self._fns or self.protean.manages(key) or (self.harmony is not None and self.harmony.manages(key))

    # -- the hot path -----------------------------------------------------------------------
    def arrived(self, key: tuple[str, str], headers: dict[str, str] | None = None) -> None:
        """Count an arrival (HarmonyPools: per app; BadApp when its app header names none)."""
        if self.harmony is not None and self.harmony.manages(key):
            self.harmony.arrived(key, headers)
            return
        if self.protean.manages(key):
            self.protean.arrived(key)
            return
        state = self._fns.get(key)
        if state is None:
            return
        with state.lock:
            state.arrivals += 1
            state.last_arrival = self.wall()
        self.history.record(f"{key[0]}/{key[1]}", state.last_arrival)

    def departed(self, key: tuple[str, str]) -> None:
        """A request counted by `arrived` was answered or failed (PROTEAN counts those in flight)."""
        self.protean.departed(key)

    def pick(
        self, key: tuple[str, str], ready: list[tuple[str, str]], headers: dict[str, str] | None = None
    ) -> str | None:
        if self.harmony is not None and self.harmony.manages(key):
            return self.harmony.pick(key, ready, headers)
        if self.protean.manages(key):
            return self.protean.pick(key, ready)
        state = self._fns.get(key)
        if state is None or not ready:
            return None
        urls = dict(ready)
        with state.lock:
            chosen = state.splitter.pick(list(urls))
        return urls.get(chosen)

    # -- manual scaling ----------------------------------------------------------------------
    def scale_to(self, key: tuple[str, str], n: int) -> None:
        """/system/scale-function on a managed function: add efficient instances or drop the smallest."""
        with self._lock:
            if self.protean.manages(key):
                self.protean.scale_to(key, n)
                return
            state = self._fns.get(key)
            if state is None:
                return
            p = state.policy
            n = min(max(n, 0 if p.scale_zero else p.min_instances), p.max_instances)
            if n > len(state.instances):
                state.instances += self._fresh(state, n - len(state.instances))
            elif n < len(state.instances):
                state.instances = sorted(state.instances, key=lambda i: -i.r_up)[:n]
            self._publish(state)

    def scale_from_zero(self, key: tuple[str, str]) -> bool:
        if self.harmony is not None and self.harmony.manages(key):
            return True  # a plan always has a pool per group
        with self._lock:
            if self.protean.manages(key):
                return self.protean.scale_from_zero(key)
            state = self._fns.get(key)
            if state is None:
                return False
            if not state.instances:
                state.instances = self._fresh(state, 1)
                self._publish(state)
            return True

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
        now = self.clock()
        with self._lock:
            for state in list(self._fns.values()):
                self._decide(state, now)
            if self.harmony is not None:
                self.harmony.tick(now)
            self.protean.tick(now)

    def _measure(self, state: _State, now: float) -> float:
        """The arrival rate: the larger of the window's and the last second's (Knative's panic
        window): a step of load is answered with instances sized for the step, not for the first
        sliver of it that a slow average lets through, and a dip does not release at once."""
        with state.lock:
            state.samples.append((now, state.arrivals))
        while len(state.samples) > 2 and now - state.samples[1][0] >= self.window_s:
            state.samples.popleft()
        (t0, n0), (t1, n1) = state.samples[0], state.samples[-1]
        stable = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        recent = next((s for s in reversed(state.samples) if t1 - s[0] >= PANIC_WINDOW_S), None)
        panic = (n1 - recent[1]) / (t1 - recent[0]) if recent is not None and t1 > recent[0] else 0.0
        return max(stable, panic)

    def _decide(self, state: _State, now: float) -> None:
        p = state.policy
        rps = state.rps = self._measure(state, now)
        before = [i.id for i in state.instances]
        keep = 0 if p.scale_zero else p.min_instances
        loads = [InstanceLoad(i.id, i.r_low, i.r_up) for i in state.instances]
        decision = dispatch(loads, rps, keep=keep)
        state.case = decision.case
        if decision.case == "scale-up" and len(state.instances) < p.max_instances:
            state.instances += self._place(state, decision.scale_up_rps, p.max_instances - len(state.instances))
        elif decision.case == "release":
            old_enough = {i.id for i in state.instances if now - i.created >= MIN_AGE_S}
            gone = {r for r in decision.release if r in old_enough}
            state.instances = [i for i in state.instances if i.id not in gone]
        if p.scale_zero:
            self._keep_alive(state)
        rates = dispatch([InstanceLoad(i.id, i.r_low, i.r_up) for i in state.instances], rps, keep=len(state.instances))
        for inst in state.instances:
            inst.rate = rates.rates.get(inst.id, 0.0)
        weights = rates.rates if rps > 0 else {i.id: i.r_up for i in state.instances}
        with state.lock:
            state.splitter.set_weights(weights)
        if [i.id for i in state.instances] != before:
            self._publish(state)

    def _keep_alive(self, state: _State) -> None:
        """Scale an idle function to zero after its keep-alive; pre-warm it before the predicted arrival."""
        name = f"{state.record.namespace}/{state.record.name}"
        now_wall = self.wall()
        now_min = int(now_wall // 60)
        minutes = self.history.active_minutes(name, now_min - 24 * 60)
        w = state.policy.keepalive.windows(minutes, now_min)
        state.windows = (w.prewarm_s, w.keepalive_s)
        if not minutes or state.rps > 0:
            return
        since = now_wall - minutes[-1] * 60  # seconds since the last active minute began
        in_window = since <= w.prewarm_s + w.keepalive_s
        warm = in_window and (w.prewarm_s == 0 or since < 60 or since >= w.prewarm_s)
        if not warm and state.instances:
            state.instances = []
        elif warm and not state.instances:
            state.instances = self._fresh(state, 1)  # pre-warm before the predicted arrival

    # -- placement -------------------------------------------------------------------------
    def _servers(self, state: _State) -> list[Server]:
        """This node's free resources: what every managed instance (those of `state` too) leaves."""
        used_cpu, used_gpu = 0.0, [0.0] * self.gpus
        others = [s for s in self._fns.values() if s is not state]
        for s in [*others, state]:
            for i in s.instances:
                used_cpu += i.candidate.cpu
                if i.gpu_index is not None and i.gpu_index < self.gpus:
                    used_gpu[i.gpu_index] += i.candidate.gpu
        return [Server(self.node, self.cpus - used_cpu, [100.0 - u for u in used_gpu])]

    def _place(self, state: _State, rps: float, limit: int) -> list[Instance]:
        result = schedule(
            rps, self.candidates(state.policy), self._servers(state), state.policy.slo_s, max_instances=limit
        )
        return [self._instance(state, p.candidate, p.server, p.gpu_index) for p in result.placements]

    def _fresh(self, state: _State, n: int) -> list[Instance]:
        """n instances for a function with no measured load: the most efficient batch-1 config,
        or the fastest one for a best-effort function whose SLO no configuration meets."""
        out: list[Instance] = []
        for _ in range(n):
            placed = self._place(state, 1e-6, 1)
            if not placed:
                cands = sorted((c for c in self.candidates(state.policy) if c.batch == 1), key=lambda c: c.t_exec_s)
                if not cands:
                    break
                placed = [self._instance(state, cands[0], self.node, None)]
            state.instances.extend(placed)  # so the next one sees the resources taken
            out += placed
        del state.instances[len(state.instances) - len(out) :]
        return out

    def _instance(self, state: _State, c: Candidate, server: str, gpu_index: int | None) -> Instance:
        slo = state.policy.slo_s
        if c.t_exec_s <= slo and (c.batch == 1 or c.t_exec_s <= slo / 2):
            b = bounds(c.t_exec_s, slo, c.batch)
            r_low, r_up = b.r_low, b.r_up
        else:  # best effort: as fast as it goes
            r_low, r_up = 0.0, float(max(1, math.floor(1 / c.t_exec_s)) * c.batch)
        rid = f"{state.record.name}-b{c.batch}c{int(c.cpu)}" + (f"g{int(c.gpu)}" if c.gpu else "")
        return Instance(
            f"{rid}-{uuid.uuid4().hex[:4]}",
            c,
            r_low,
            r_up,
            batch_timeout_s(c.t_exec_s, slo, c.batch),
            server,
            gpu_index,
            self.clock(),
        )

    # -- state -----------------------------------------------------------------------------
    def _publish(self, state: _State) -> None:
        key = state.record.key
        plan = [InstanceSpec(i.id, i.env(state.policy.slo_s)) for i in state.instances]
        self.runtime.set_plan(*key, plan)
        self.ds.put(PLANS_PREFIX + f"{key[0]}/{key[1]}", json.dumps([i.to_json() for i in state.instances]))
        self.set_replicas(key[0], key[1], len(state.instances))

    def _load(self, key: tuple[str, str]) -> list[Instance]:
        kv = self.ds.get(PLANS_PREFIX + f"{key[0]}/{key[1]}")
        if kv is None:
            return []
        try:
            return [Instance.from_json(d, self.clock()) for d in json.loads(kv.value)]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a corrupt instance plan for %s.%s", key[1], key[0])
            return []

    def describe(self, key: tuple[str, str]) -> dict | None:
        if self.harmony is not None and self.harmony.manages(key):
            return self.harmony.describe(key)
        if self.protean.manages(key):
            return self.protean.describe(key)
        state = self._fns.get(key)
        if state is None:
            return None
        p = state.policy
        return {
            "name": key[1],
            "namespace": key[0],
            "policy": "infless",
            "model": p.model,
            "sloMs": p.slo_s * 1000,
            "bestEffort": p.best_effort,
            "rps": round(state.rps, 3),
            "case": state.case,
            "rMin": sum(i.r_low for i in state.instances),
            "rMax": sum(i.r_up for i in state.instances),
            "keepAlive": {
                "policy": p.keepalive.name,
                "scaleZero": p.scale_zero,
                "prewarmS": state.windows[0],
                "keepAliveS": state.windows[1],
            },
            "instances": [i.to_json() for i in state.instances],
        }
