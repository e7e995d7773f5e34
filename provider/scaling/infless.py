"""INFless in the provider: non-uniform instances sized by the paper's pure policies.

A function is INFless-scaled when its annotations name the model to predict
(`com.faas-gpu.model`) and an SLO (`com.faas-gpu.slo-ms`). Each period this policy measures the
function's arrival rate, asks the dispatcher (`dispatch`) how to split it over the function's
instances, adds instances with Algorithm 1 (`schedule`) for the residual load or releases surplus
ones, and weighs the gateway's splitter with the rates. Each instance has its own batch size,
batch timeout (t_slo - t_exec), CPU threads and GPU share (a per-instance plan for the runtime).
With `com.faas-gpu.scale-zero: "true"` the keep-alive policy (LSTH by default) also takes an idle
function to zero and starts it again before the arrival it predicts. `com.openfaas.scale.min` and
`com.openfaas.scale.max` bound everything.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable

from faas_gpu.contract.keys import INSTANCES
from faas_gpu.datastore import Datastore
from faas_gpu.history import InvocationHistory
from faas_gpu.policies.infless import Candidate, InstanceLoad, Server, dispatch, rate_window, schedule, warm
from faas_gpu.policies.infless.capacity import batch_timeout_s, bounds

from ..types import FunctionRecord, ValidationError
from .base import Key, ScalingContext, ScalingDecision
from .infless_spec import (
    BEST_EFFORT,
    MODEL,
    SLO,
    FunctionPolicy,
    InflessState,
    Instance,
    Predictor,
)

log = logging.getLogger(__name__)

PLANS_PREFIX = INSTANCES
MIN_AGE_S = 10.0  # an instance serves this long before it may be released (no flapping)


class InflessScaling:
    """INFless's scaling (Algorithm 1, the dispatcher and LSTH keep-alive) as a scaling policy."""

    name = "infless"
    managed = True

    def __init__(
        self,
        datastore: Datastore,
        history: InvocationHistory,
        predictor: Predictor,
        *,
        cpus: float,
        gpus: int = 0,
        node: str = "local",
        window_s: float = 5.0,
        wall: Callable[[], float] = time.time,
    ):
        self.ds = datastore
        self.history = history
        self.predictor = predictor
        self.cpus, self.gpus, self.node = cpus, gpus, node
        self.window_s = window_s
        self.wall = wall
        self._states: dict[Key, InflessState] = {}
        """Every function this policy sizes: placement shares this node's CPUs and GPUs among them."""

    # -- deploy-time ------------------------------------------------------------------------
    def candidates(self, policy: FunctionPolicy) -> list[Candidate]:
        try:
            rows = self.predictor.configs(policy.model, gpu=self.gpus > 0)
        except LookupError as exc:
            raise ValidationError(f"annotations: {MODEL}: {exc.args[0] if exc.args else exc}") from None
        return [Candidate(b, c, g, ms / 1000.0) for b, c, g, ms in rows if c <= self.cpus and (g == 0 or self.gpus)]

    def policy_of(self, record: FunctionRecord) -> FunctionPolicy:
        """Refuse a model without a profile, or an SLO below the model's best predicted latency."""
        policy = FunctionPolicy.of(record)
        if policy is None:
            raise ValidationError(f"annotations: {MODEL} and {SLO} are required for INFless scaling")
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

    def validate(self, record: FunctionRecord) -> None:
        self.policy_of(record)

    def adopt(self, record: FunctionRecord, now: float, previous: InflessState | None) -> ScalingDecision:
        """Keep the instances of an update that asks the same of the policy; after a provider
        restart, take the plan it published; else start the most efficient ones."""
        policy = self.policy_of(record)
        key = record.key
        state = InflessState(record, policy, rate_window=rate_window(self.window_s))
        if previous is not None and previous.policy == policy:
            state.instances, state.splitter = previous.instances, previous.splitter
            state.rate_window = previous.rate_window
        else:
            saved = self._load(key, now) if previous is None else []
            state.instances = saved or self._fresh(state, max(policy.min_instances, record.replicas), now)
        self._states[key] = state
        return self._decision(state)

    def forget(self, key: Key, *, deleted: bool) -> None:
        self._states.pop(key, None)
        self.ds.delete(PLANS_PREFIX + f"{key[0]}/{key[1]}")
        if deleted:
            self.history.forget(f"{key[0]}/{key[1]}")

    # -- the hot path -----------------------------------------------------------------------
    def arrived(self, key: Key, state: InflessState, headers: dict[str, str] | None) -> str | None:
        """Keep-alive predicts from the minutes with calls: record this one."""
        self.history.record(f"{key[0]}/{key[1]}", self.wall())
        return None

    def pick(self, state: InflessState, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        if not ready:
            return None
        urls = dict(ready)
        with state.lock:
            chosen = state.splitter.pick(list(urls))
        return urls.get(chosen)

    # -- decisions -------------------------------------------------------------------------
    def scale_to(self, ctx: ScalingContext, n: int) -> ScalingDecision:
        """Add efficient instances or drop the smallest."""
        state: InflessState = ctx.state
        p = state.policy
        n = min(max(n, 0 if p.scale_zero else p.min_instances), p.max_instances)
        if n > len(state.instances):
            state.instances += self._fresh(state, n - len(state.instances), ctx.now)
        elif n < len(state.instances):
            state.instances = sorted(state.instances, key=lambda i: -i.r_up)[:n]
        return self._decision(state)

    def scale_from_zero(self, ctx: ScalingContext) -> ScalingDecision:
        state: InflessState = ctx.state
        if not state.instances:
            state.instances = self._fresh(state, 1, ctx.now)
        return self._decision(state)

    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        state: InflessState = ctx.state
        now = ctx.now
        p = state.policy
        rps = state.rps = self._measure(state, ctx.load.arrivals, now)
        keep = 0 if p.scale_zero else p.min_instances
        loads = [InstanceLoad(i.id, i.r_low, i.r_up) for i in state.instances]
        decision = dispatch(loads, rps, keep=keep)
        state.case = decision.case
        if decision.case == "scale-up" and len(state.instances) < p.max_instances:
            state.instances += self._place(state, decision.scale_up_rps, p.max_instances - len(state.instances), now)
        elif decision.case == "release":
            old_enough = {i.id for i in state.instances if now - i.created >= MIN_AGE_S}
            gone = {r for r in decision.release if r in old_enough}
            state.instances = [i for i in state.instances if i.id not in gone]
        if p.scale_zero:
            self._keep_alive(state, now)
        rates = dispatch([InstanceLoad(i.id, i.r_low, i.r_up) for i in state.instances], rps, keep=len(state.instances))
        for inst in state.instances:
            inst.rate = rates.rates.get(inst.id, 0.0)
        weights = rates.rates if rps > 0 else {i.id: i.r_up for i in state.instances}
        with state.lock:
            state.splitter.set_weights(weights)
        return self._decision(state)

    def _decision(self, state: InflessState) -> ScalingDecision:
        specs = tuple(i.spec(state.policy.slo_s) for i in state.instances)
        return ScalingDecision(state, len(specs), specs)

    def _measure(self, state: InflessState, arrivals: int, now: float) -> float:
        """The arrival rate: the larger of the window's and the last second's (Knative's panic
        window): a step of load is answered with instances sized for the step, not for the first
        sliver of it that a slow average lets through, and a dip does not release at once."""
        return state.rate_window.observe(now, arrivals)

    def _keep_alive(self, state: InflessState, now: float) -> None:
        """Scale an idle function to zero after its keep-alive; pre-warm it before the predicted arrival."""
        name = f"{state.record.namespace}/{state.record.name}"
        now_wall = self.wall()
        now_min = int(now_wall // 60)
        minutes = self.history.active_minutes(name, now_min - 24 * 60)
        w = state.policy.keepalive.windows(minutes, now_min)
        state.windows = (w.prewarm_s, w.keepalive_s)
        if not minutes or state.rps > 0:
            return
        keep = warm(w, now_wall - minutes[-1] * 60)  # seconds since the last active minute began
        if not keep and state.instances:
            state.instances = []
        elif keep and not state.instances:
            state.instances = self._fresh(state, 1, now)  # pre-warm before the predicted arrival

    # -- placement -------------------------------------------------------------------------
    def _servers(self, state: InflessState) -> list[Server]:
        """This node's free resources: what every managed instance (those of `state` too) leaves."""
        used_cpu, used_gpu = 0.0, [0.0] * self.gpus
        others = [s for s in self._states.values() if s is not state]
        for s in [*others, state]:
            for i in s.instances:
                used_cpu += i.candidate.cpu
                if i.gpu_index is not None and i.gpu_index < self.gpus:
                    used_gpu[i.gpu_index] += i.candidate.gpu
        return [Server(self.node, self.cpus - used_cpu, [100.0 - u for u in used_gpu])]

    def _place(self, state: InflessState, rps: float, limit: int, now: float) -> list[Instance]:
        result = schedule(
            rps, self.candidates(state.policy), self._servers(state), state.policy.slo_s, max_instances=limit
        )
        return [self._instance(state, p.candidate, p.server, p.gpu_index, now) for p in result.placements]

    def _fresh(self, state: InflessState, n: int, now: float) -> list[Instance]:
        """n instances for a function with no measured load: the most efficient batch-1 config,
        or the fastest one for a best-effort function whose SLO no configuration meets."""
        out: list[Instance] = []
        for _ in range(n):
            placed = self._place(state, 1e-6, 1, now)
            if not placed:
                cands = sorted((c for c in self.candidates(state.policy) if c.batch == 1), key=lambda c: c.t_exec_s)
                if not cands:
                    break
                placed = [self._instance(state, cands[0], self.node, None, now)]
            state.instances.extend(placed)  # so the next one sees the resources taken
            out += placed
        del state.instances[len(state.instances) - len(out) :]
        return out

    def _instance(self, state: InflessState, c: Candidate, server: str, gpu_index: int | None, now: float) -> Instance:
        slo = state.policy.slo_s
        if c.t_exec_s <= slo and (c.batch == 1 or c.t_exec_s <= slo / 2):
            b = bounds(c.t_exec_s, slo, c.batch)
            r_low, r_up = b.r_low, b.r_up
        else:  # best effort: as fast as it goes
            r_low, r_up = 0.0, float(max(1, math.floor(1 / c.t_exec_s)) * c.batch)
        return Instance.new(
            state.record.name, c, r_low, r_up, batch_timeout_s(c.t_exec_s, slo, c.batch), server, gpu_index, now
        )

    # -- state -----------------------------------------------------------------------------
    def applied(self, key: Key, state: InflessState) -> None:
        """The plan a restarted provider takes up again (`adopt`), rates and bounds included."""
        self.ds.put(PLANS_PREFIX + f"{key[0]}/{key[1]}", json.dumps([i.to_json() for i in state.instances]))

    def _load(self, key: Key, now: float) -> list[Instance]:
        kv = self.ds.get(PLANS_PREFIX + f"{key[0]}/{key[1]}")
        if kv is None:
            return []
        try:
            return [Instance.from_json(d, now) for d in json.loads(kv.value)]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a corrupt instance plan for %s.%s", key[1], key[0])
            return []

    def describe(self, ctx: ScalingContext) -> dict | None:
        state: InflessState = ctx.state
        key = state.record.key
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
