"""INFless in the provider: non-uniform instances sized by the paper's pure policies.

A function is INFless-scaled when its annotations name the model to predict
(`com.faas-gpu.model`) and an SLO (`com.faas-gpu.slo-ms`). Each period this policy measures the
function's arrival rate, asks the dispatcher (`dispatch`) how to split it over the function's
instances, adds instances with Algorithm 1 (`schedule`) for the residual load or releases surplus
ones, and weighs the gateway's splitter with the rates. Each instance has its own batch size,
batch timeout (t_slo - t_exec, less a margin for the path's variance), CPU threads and GPU share
(a per-instance plan for the runtime). The serving path's CPU, measured by `faas-gpu profile
--path`, is reserved on this node beside the instances' cores (every function's instances share
it), and an observed shortfall makes that CPU dearer before it slows the model (`corrections`).
A re-plan that would restart instances (a new batch size or thread count) must pay for the
restart (`restart_pays`: the running plan clearly short, the new one clearly better on the
measured footing, 30 s since the last), no batch is planned that the measured arrivals do not fill
within its timeout (`fills`), a plan whose batches the arrivals no longer fill is made again for
them (`underfilled`), and corrections fade back toward 1 while the demand is met.
With `com.faas-gpu.scale-zero: "true"` the keep-alive policy (LSTH by default) also takes an idle
function to zero and starts it again before the arrival it predicts; with OpenFaaS Pro's
`com.openfaas.scale.zero: "true"` it goes to zero after `com.openfaas.scale.zero-duration` without a
call. A call in flight is demand either way (`faas_gpu.policies.scale_zero`): a call waiting at the
gateway for the instance its arrival at zero started keeps that instance, which is not released
before it is ready. `com.openfaas.scale.min` and `com.openfaas.scale.max` bound everything.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable

from faas_gpu.contract.keys import INSTANCES
from faas_gpu.datastore import Datastore, DatastoreError
from faas_gpu.fn_credentials import uploaded_batches
from faas_gpu.history import InvocationHistory
from faas_gpu.policies.infless import (
    Candidate,
    InstanceLoad,
    PathCost,
    Server,
    correction,
    corrections,
    decayed,
    demand,
    dispatch,
    fills,
    observed_capacity,
    rate_window,
    restart_pays,
    schedule,
    underfilled,
    warm,
    with_path,
)
from faas_gpu.policies.infless.capacity import batch_timeout_s, bounds
from faas_gpu.policies.infless.replan import MIN_RESTART_GAP_S
from faas_gpu.policies.scale_zero import holds, releasable, wake_to

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
MAX_CORRECTION = 4.0  # the most the observed capacity may slow the model (or make the path's CPU dearer) by
SETTLE_WINDOWS = 4  # rate windows a plan serves before its capacity is judged (its cold starts are over)
MEETS_DEMAND = 0.95  # answered at least this share of the arrivals with nothing queued: corrections fade
PROVISIONAL_SLO_SHARE = 0.25
"""Before its model is profiled, a batch of one is assumed to take this share of the SLO (the
client's default batch timeout is the same quarter): a slow model's guess, so the conservative plan
errs toward more instances, and what is observed at saturation corrects it (`_observe`)."""


def scaled_wall(scale: float = 1.0, wall: Callable[[], float] = time.time) -> Callable[[], float]:
    """The keep-alive's clock: the wall's, running `scale` times faster (1: the wall's itself). A
    trace replayed F times compressed (`faas-gpu replay --keepalive`) then keeps its minutes in the
    invocation history and in LSTH's and HHP's windows. It is the wall's times `scale` (not counted
    from the provider's start), so its minutes begin at wall times that are multiples of 60/scale:
    a replay that starts on one (`aligned_start`) has each trace minute in one history minute. From
    an arbitrary start a trace minute straddled two, and the extra 1-minute idle times moved the
    histograms' windows (HHP's, LSTH's) away from the simulator's."""
    if scale == 1.0:
        return wall
    return lambda: wall() * scale


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
        time_scale: float = 1.0,
    ):
        self.ds = datastore
        self.history = history
        self.predictor = predictor
        self.cpus, self.gpus, self.node = cpus, gpus, node
        self.window_s = window_s
        self.wall = wall
        self.time_scale = time_scale  # `wall`'s speed (`scaled_wall`): idle seconds are counted on it too
        self._states: dict[Key, InflessState] = {}
        """Every function this policy sizes: placement shares this node's CPUs and GPUs among them."""

    # -- deploy-time ------------------------------------------------------------------------
    def path_cost(self) -> PathCost | None:
        """The serving path's cost on this node, as `faas-gpu profile --path` measured it (None: not yet)."""
        ask = getattr(self.predictor, "path_cost", None)
        measured = ask(self.node) if ask is not None else None
        if not measured:
            return None
        # (fixed, per request), optionally followed by the CPU the path spends per batch and per request
        ms = [None if v is None else float(v) / 1000.0 for v in measured]
        return PathCost(ms[0], ms[1], *ms[2:4])

    def path_cpu(self, state: InflessState) -> PathCost | None:
        """The path's CPU as `state`'s plans reserve it on the node: its cost, times the function's
        path correction (the shortfall observed while its instances shared the path)."""
        path = self.path_cost()
        return None if path is None else path.cpu_scaled(state.path_correction)

    def candidates(
        self,
        policy: FunctionPolicy,
        factor: float = 1.0,
        provisional_s: float | None = None,
    ) -> list[Candidate]:
        """The profiled configurations as the whole path serves them: model time + the path's cost
        (`with_path`), times the function's observed `factor`. A model
        with no profile yet has one, provisional configuration when `provisional_s` is given
        (batch 1, one CPU thread, that long a batch: `_provisional`), else it is refused."""
        try:
            rows = self.predictor.configs(policy.model, gpu=self.gpus > 0)
        except LookupError as exc:
            if provisional_s is not None:
                rows = [(1, 1, 0, provisional_s * 1000.0)]
            else:
                raise ValidationError(f"annotations: {MODEL}: {exc.args[0] if exc.args else exc}") from None
        path = self.path_cost()
        return [
            with_path(Candidate(b, c, g, ms / 1000.0), path, factor)
            for b, c, g, ms in rows
            if c <= self.cpus and (g == 0 or self.gpus)
        ]

    def profiled(self, model: str) -> bool:
        """Whether the profile store knows the model (a profile may arrive while the function serves)."""
        try:
            self.predictor.configs(model, gpu=self.gpus > 0)
        except LookupError:
            return False
        return True

    def policy_of(self, record: FunctionRecord) -> FunctionPolicy:
        """Refuse an SLO below the model's best predicted latency. A model without a profile is
        accepted (a deploy never waits for a profile): it is served on a conservative plan until
        one is stored (`_provisional`), and its SLO is checked then (`_check_profile`)."""
        policy = FunctionPolicy.of(record)
        if policy is None:
            raise ValidationError(f"annotations: {MODEL} and {SLO} are required for INFless scaling")
        if not self.profiled(policy.model):
            return policy
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
        state.planned_at = now
        if not self.profiled(policy.model):
            state.provisional_s, state.profile_checked_at = policy.slo_s * PROVISIONAL_SLO_SHARE, now
            log.warning(
                "%s: model %r has no profile yet: served on a conservative plan (batch 1, %.0f ms a batch assumed, "
                "batches grow under load within its SLO) until `faas-gpu profile` stores one; re-planned then",
                record.name,
                policy.model,
                state.provisional_s * 1000,
            )
        same_footing = previous is not None and (previous.provisional_s is None) == (state.provisional_s is None)
        if previous is not None and previous.policy == policy and same_footing:
            state.instances, state.splitter = previous.instances, previous.splitter
            state.rate_window = previous.rate_window
            state.correction, state.planned_at = previous.correction, previous.planned_at
            state.path_correction = previous.path_correction
            state.restarted_at, state.decayed_at = previous.restarted_at, previous.decayed_at
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
        state.called_at = now = self.wall()
        self.history.record(f"{key[0]}/{key[1]}", now)
        return None

    def pick(self, state: InflessState, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        if not ready:
            return None
        urls = dict(ready)
        with state.lock:
            state.ready_ids = urls.keys()  # which planned instances serve: a plan is judged once all do
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
        """A call found no ready instance: the function's minimum (at least one) of the most
        efficient batch-1 instances, unless instances are planned already (still starting)."""
        state: InflessState = ctx.state
        if not state.instances:
            state.instances = self._fresh(state, wake_to(state.policy.min_instances), ctx.now)
            state.planned_at = ctx.now
        return self._decision(state)

    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        state: InflessState = ctx.state
        now = ctx.now
        p = state.policy
        rps = state.rps = self._measure(state, ctx.load.arrivals, now)
        if state.provisional_s is not None:
            self._check_profile(state, now)
        self._observe(state, ctx, now)
        in_flight = ctx.load.in_flight  # calls being served or waiting for an instance: demand
        # the dispatcher releases down to com.openfaas.scale.min; below it, to zero, only the
        # keep-alive takes a scale-zero function (`_keep_alive`), never a release under load's dip
        keep = max(p.min_instances, holds(in_flight))
        loads = [InstanceLoad(i.id, i.r_low, i.r_up) for i in state.instances]
        rps = demand(rps, sum(i.r_up for i in state.instances), state.saturated, state.observed)
        decision = dispatch(loads, rps, keep=keep)
        state.case = decision.case
        if state.replan and rps > 0:
            state.case = "re-plan"
            self._replan(state, rps, now, force=True)
        elif decision.case == "scale-up":
            self._replan(state, rps, now, residual=decision.scale_up_rps)
        elif decision.case == "release":
            may_go = {
                i.id
                for i in state.instances
                if releasable(i.id in state.ready_ids, now - i.created, MIN_AGE_S, in_flight)
            }
            gone = {r for r in decision.release if r in may_go}
            state.instances = [i for i in state.instances if i.id not in gone]
        elif self._underfilled(state, now):
            state.case = "re-plan"
            self._refill(state, now)
        if p.scale_zero:
            self._keep_alive(state, now, in_flight, ctx.idle_s * self.time_scale)
        rates = dispatch([InstanceLoad(i.id, i.r_low, i.r_up) for i in state.instances], rps, keep=len(state.instances))
        for inst in state.instances:
            inst.rate = rates.rates.get(inst.id, 0.0)
        weights = rates.rates if rps > 0 else {i.id: i.r_up for i in state.instances}
        with state.lock:
            state.splitter.set_weights(weights)
        return self._decision(state)

    def _observe(self, state: InflessState, ctx: ScalingContext, now: float) -> None:
        """Throughput at saturation against the plan's prediction: a shortfall corrects the model
        (`correction`) and asks for a re-plan; a capacity above the prediction takes an earlier
        correction back. A plan is judged only after it has served `SETTLE_WINDOWS` rate windows
        with every planned instance ready (as the gateway's picks see them): a cold start, which
        also takes CPU from the instances serving meanwhile, is not held against it."""
        state.done_rps = state.done_window.observe(now, ctx.load.ok)
        state.concurrency = max(1, ctx.load.peak_in_flight)
        state.model_max_batch = self._model_max_batch(state)
        state.replan = state.saturated = False
        if any(i.id not in state.ready_ids for i in state.instances):
            state.planned_at = now  # a planned instance is still starting: its plan is not judged yet
        if not state.instances or now - state.planned_at < SETTLE_WINDOWS * self.window_s:
            return
        slots = sum(i.candidate.batch for i in state.instances)
        seen = observed_capacity(state.done_rps, ctx.load.peak_in_flight, slots)
        if seen is None:
            if ctx.load.peak_in_flight <= slots:  # nothing queued beyond the batches in progress
                self._fade(state, now)
            return
        state.observed, state.observed_at, state.saturated = seen, now, True
        predicted = sum(i.r_up for i in state.instances)
        factor = correction(predicted, seen)
        path_f, model_f = corrections(
            state.path_correction,
            state.correction,
            factor or 1.0,
            path_known=self.path_cost() is not None,
            limit=MAX_CORRECTION,
        )
        if abs(path_f - state.path_correction) > 1e-9 or abs(model_f - state.correction) > 1e-9:
            state.path_correction, state.correction = path_f, model_f
            state.replan = True
            state.planned_at = now  # the corrected model is judged again once its plan has settled
            log.info(
                "%s: observed %.0f rps at saturation, predicted %.0f: path CPU x%.2f, model time x%.2f, re-planned",
                state.record.name,
                seen,
                predicted,
                state.path_correction,
                state.correction,
            )

    def _check_profile(self, state: InflessState, now: float) -> None:
        """A function served before its model was profiled: once the store has a profile (the
        background `faas-gpu profile` that `faas-gpu up` starts, or one run by hand), its SLO is
        checked as a deploy would, and it is planned afresh by Algorithm 1 for what arrives (the
        runtime keeps each replaced instance serving until its successor is ready). Looked up once a
        rate window. An SLO the profile says no configuration meets leaves the conservative plan
        serving and `describe` saying why."""
        if now - state.profile_checked_at < self.window_s:
            return
        state.profile_checked_at = now
        if not self.profiled(state.policy.model):
            return
        try:
            self.policy_of(state.record)
        except ValidationError as exc:
            if state.problem != str(exc):
                log.error("%s: its profile arrived, but %s", state.record.name, exc)
            state.problem = str(exc)
            return
        state.provisional_s, state.problem = None, None
        state.correction = state.path_correction = 1.0  # they corrected the provisional guess, not the model
        if not state.instances:
            return  # at zero: the next instance is planned from the profile
        n = max(len(state.instances), state.policy.min_instances)
        fresh = self._place(state, state.rps, n, now, without_own=True) if state.rps > 0 else []
        fresh = fresh or self._fresh(state, n, now)
        if fresh:
            state.instances = fresh
            state.planned_at = state.restarted_at = now
            log.info(
                "%s: model %r profiled: re-planned as batch %s",
                state.record.name,
                state.policy.model,
                ", ".join(str(i.candidate.batch) for i in fresh),
            )

    def _fade(self, state: InflessState, now: float) -> None:
        """A settled plan that answers what arrives with nothing queued (no more requests in flight
        than its batches hold: a closed loop's callers are always "answered", so the answer rate
        alone proves nothing): the corrections move one step back toward 1 (`decayed`), at most
        once a rate window, and the rates follow them."""
        if state.correction <= 1.0 and state.path_correction <= 1.0:
            return
        if state.rps <= 0 or state.done_rps < MEETS_DEMAND * state.rps or now - state.decayed_at < self.window_s:
            return
        state.correction, state.path_correction = decayed(state.correction), decayed(state.path_correction)
        state.decayed_at = now
        state.replan = True  # the rates follow; a restart still has to pay (`_may_restart`)

    def _may_restart(self, state: InflessState, fresh: list[Instance], demand_rps: float, now: float) -> bool:
        """Hysteresis for a re-plan that restarts instances (`restart_pays`): the running plan is
        clearly short of `demand_rps` and `fresh` promises clearly more on the measured footing, and
        the last such re-plan is MIN_RESTART_GAP_S old. (The runtime keeps a replaced instance
        serving until its successor is ready: `reconcile_plan`.)"""
        if not state.instances:
            return True
        if now - state.restarted_at < MIN_RESTART_GAP_S:
            return False
        observed = state.observed if state.observed_at >= state.restarted_at else None  # this plan's own
        return restart_pays(_r_max(state.instances), observed, _r_max(fresh), demand_rps)

    def _underfilled(self, state: InflessState, now: float) -> bool:
        """The measured arrivals are under the plan's lower bound (`underfilled`: its batches
        leave by their timeouts), on a plan that has settled, and the last restart is
        MIN_RESTART_GAP_S old."""
        if now - state.planned_at < SETTLE_WINDOWS * self.window_s or now - state.restarted_at < MIN_RESTART_GAP_S:
            return False
        return underfilled(state.rps, (i.r_low for i in state.instances))

    def _refill(self, state: InflessState, now: float) -> None:
        """Algorithm 1's plan for what arrives (only batches it fills: `_place`) in place of one it
        no longer fills; a restart that pays in latency, not in capacity, so `restart_pays` is not
        asked."""
        fresh = self._place(state, state.rps, state.policy.max_instances, now, without_own=True)
        if fresh and _configs(fresh) != _configs(state.instances):
            log.info(
                "%s: %.1f rps arrive, under the plan's lower bound of %.0f: re-planned as batch %s",
                state.record.name,
                state.rps,
                sum(i.r_low for i in state.instances),
                ", ".join(str(i.candidate.batch) for i in fresh),
            )
            state.instances = fresh
            state.planned_at = state.restarted_at = now

    def _rerate(self, state: InflessState) -> None:
        """The running instances' rates under the corrected model, without restarting any: each
        configuration placed again (Algorithm 1, one instance) on what the node leaves; its batch,
        threads and timeout, which the instance runs with, are kept."""
        cands = {
            (c.batch, c.cpu, c.gpu): c
            for c in self.candidates(state.policy, state.correction, provisional_s=state.provisional_s)
        }
        servers = self._servers(state, without_own=True)
        path = self.path_cpu(state)
        for inst in sorted(state.instances, key=lambda i: -i.candidate.batch):
            c = cands.get(_config(inst))
            if c is None:
                continue
            result = schedule(1e12, [c], servers, state.policy.slo_s, max_instances=1, path=path)
            if result.placements:
                inst.r_low, inst.r_up = result.placements[0].r_low, result.placements[0].r_up
                servers = result.servers

    def _replan(
        self, state: InflessState, rps: float, now: float, *, residual: float = 0.0, force: bool = False
    ) -> None:
        """More capacity for `rps`: Algorithm 1 for the residual beside the instances kept (INFless's
        non-uniform instances), or for the whole load from scratch when adding instances cannot
        serve it and a new plan can (batching the residual plan cannot reach: the node's cores are
        spent on the path) or `force` (a corrected model).
        A plan from scratch that restarts instances must pay for it (`_may_restart`); otherwise a
        corrected model only re-rates the running instances."""
        p = state.policy
        limit = p.max_instances
        if force:
            self._rerate(state)  # the running plan on the corrected footing the new one is made on
        others = list(state.instances)
        fresh = self._place(state, rps, limit, now, without_own=True)
        covered = sum(i.r_up for i in fresh) >= rps - 1e-9
        added: list[Instance] = []
        if not force and len(others) < limit:
            added = self._place(state, residual, limit - len(others), now)
        incremental = others + added
        if fresh and _configs(fresh) == _configs(state.instances):
            # the plan from scratch is the one running: no instance is restarted for it, but its
            # rates are the new plan's (a corrected path CPU changes what the node serves)
            for old, new in zip(sorted(state.instances, key=_config), sorted(fresh, key=_config), strict=True):
                old.r_low, old.r_up = new.r_low, new.r_up
            return
        incremental_covers = sum(i.r_up for i in incremental) >= rps - 1e-9
        leaner = fresh and (
            force
            # INFless schedules the residual beside the running instances (non-uniform instances);
            # the whole load is planned afresh only when that cannot serve it and a new plan can
            or (covered and not incremental_covers)
            or (not covered and not incremental_covers and _r_max(fresh) > _r_max(incremental))
        )
        if leaner and self._may_restart(state, fresh, rps, now):
            state.instances = fresh
            state.planned_at = state.restarted_at = now
        elif added:
            state.instances = incremental
            state.planned_at = now

    def _decision(self, state: InflessState) -> ScalingDecision:
        specs = tuple(i.spec(state.policy.slo_s) for i in state.instances)
        return ScalingDecision(state, len(specs), specs)

    def _measure(self, state: InflessState, arrivals: int, now: float) -> float:
        """The arrival rate: the larger of the window's and the last second's (Knative's panic
        window): a step of load is answered with instances sized for the step, not for the first
        sliver of it that a slow average lets through, and a dip does not release at once."""
        return state.rate_window.observe(now, arrivals)

    def _keep_alive(self, state: InflessState, now: float, in_flight: int, idle_s: float) -> None:
        """Scale an idle function to zero after its keep-alive; pre-warm it before the predicted
        arrival. The window counts from the last call itself (`idle_s`, the router's: since the
        deploy when no call came, on the keep-alive clock), and calls in flight keep it warm (`warm`).

        The windows are the ones the last active minute set (as the Fig. 16 replay, the Azure
        study's method, reads them): re-read as the clock moves on with no call, LSTH's 1-hour
        histogram lost its idle times one by one and a closed window could open again, a pre-warm
        no arrival predicted. A call that arrived within the rate window (`window_s`, counted on the
        keep-alive clock as `idle_s` is) is load, not idleness; the measured rate said so in wall
        seconds, which a replay's compressed clock made 20-30 times longer than the rule's minutes."""
        name = f"{state.record.namespace}/{state.record.name}"
        now_wall = self.wall()
        now_min = int(now_wall // 60)
        minutes = self.history.active_minutes(name, now_min - 24 * 60)
        w = state.policy.keepalive.windows(minutes, minutes[-1] if minutes else now_min)
        state.windows = (w.prewarm_s, w.keepalive_s)
        if now_wall - state.called_at < self.window_s:
            return
        since_minute = now_wall - minutes[-1] * 60 if minutes else idle_s  # since the last active minute began
        keep = warm(w, since_minute, since_call_s=idle_s, in_flight=in_flight)
        if not keep and state.instances:
            state.instances = []
        elif keep and not state.instances and minutes and w.prewarm_s > 0:
            # pre-warm before the arrival the histogram predicts; a window without a pre-warm gap
            # predicts none (it only keeps warm), and a function taken to zero waits for a call
            state.instances = self._fresh(state, 1, now)

    # -- placement -------------------------------------------------------------------------
    def _servers(self, state: InflessState, without_own: bool = False) -> list[Server]:
        """This node's free resources: what every managed instance (those of `state` too, unless
        `without_own`: a plan from scratch) leaves, its cores and the path's CPU for its r_up."""
        used_cpu, used_gpu = 0.0, [0.0] * self.gpus
        others = [s for s in self._states.values() if s is not state]
        for s in [*others, *([] if without_own else [state])]:
            path = self.path_cpu(s)
            for i in s.instances:
                used_cpu += i.candidate.cpu
                if path is not None:
                    used_cpu += i.r_up * path.cpu_per_request_s(i.candidate.batch)
                if i.gpu_index is not None and i.gpu_index < self.gpus:
                    used_gpu[i.gpu_index] += i.candidate.gpu
        return [Server(self.node, self.cpus - used_cpu, [100.0 - u for u in used_gpu])]

    def _place(
        self, state: InflessState, rps: float, limit: int, now: float, *, without_own: bool = False
    ) -> list[Instance]:
        """Algorithm 1 over the corrected candidates, batches no larger than the measured arrivals
        fill within the batch's timeout (`fills`: a bigger batch would only ever leave by its
        timeout, part full), and the instances' batches together no more rows than the calls seen
        in flight at once, less those of the instances kept beside them (`rows_in_flight`, which
        also keeps each batch within the calls in flight); the path's CPU reserved on the node."""
        slo = state.policy.slo_s
        cands = [
            c
            for c in self.candidates(state.policy, state.correction, provisional_s=state.provisional_s)
            if fills(c, slo, state.rps)
        ]
        servers = self._servers(state, without_own)
        kept_rows = 0 if without_own else sum(i.candidate.batch for i in state.instances)
        result = schedule(
            rps,
            cands,
            servers,
            state.policy.slo_s,
            max_instances=limit,
            path=self.path_cpu(state),
            max_batch=state.model_max_batch,
            rows_in_flight=max(0, state.concurrency - kept_rows),
        )
        return [
            self._instance(state, p.candidate, p.server, p.gpu_index, now, (p.r_low, p.r_up, p.timeout_s))
            for p in result.placements
        ]

    def _model_max_batch(self, state: InflessState) -> int | None:
        """The largest batch every model the function uploaded accepts (`uploaded_batches`: the
        scheduler's reading of their archives, sealed in the datastore); the last known when the
        datastore does not answer."""
        try:
            batches = uploaded_batches(self.ds, state.record.namespace, state.record.name)
        except DatastoreError:
            return state.model_max_batch
        limits = [b.max_rows for b in batches.values() if b.max_rows is not None]
        return min(limits) if limits else None

    def _fresh(self, state: InflessState, n: int, now: float) -> list[Instance]:
        """n instances for a function with no measured load: the most efficient batch-1 config,
        or the fastest one for a best-effort function whose SLO no configuration meets."""
        out: list[Instance] = []
        for _ in range(n):
            placed = self._place(state, 1e-6, 1, now)
            if not placed:
                cands = sorted(
                    (
                        c
                        for c in self.candidates(state.policy, state.correction, provisional_s=state.provisional_s)
                        if c.batch == 1
                    ),
                    key=lambda c: c.t_exec_s,
                )
                if not cands:
                    break
                placed = [self._instance(state, cands[0], self.node, None, now)]
            state.instances.extend(placed)  # so the next one sees the resources taken
            out += placed
        del state.instances[len(state.instances) - len(out) :]
        return out

    def _instance(
        self,
        state: InflessState,
        c: Candidate,
        server: str,
        gpu_index: int | None,
        now: float,
        placed: tuple[float, float, float] | None = None,
    ) -> Instance:
        """An instance of `c`: with the (r_low, r_up, timeout) Algorithm 1 `placed` it at (r_up
        cut to the node's CPU for the path), else Eq. 1's."""
        slo = state.policy.slo_s
        timeout = batch_timeout_s(c.t_exec_s, slo, c.batch, c.path_s)
        if placed is not None:
            r_low, r_up, timeout = placed
        elif c.t_exec_s <= slo and (c.batch == 1 or c.t_exec_s <= slo / 2):
            b = bounds(c.t_exec_s, slo, c.batch, c.path_s)
            r_low, r_up = b.r_low, b.r_up
        else:  # best effort: as fast as it goes
            r_low, r_up = 0.0, float(max(1, math.floor(1 / c.t_exec_s)) * c.batch)
        return Instance.new(state.record.name, c, r_low, r_up, timeout, server, gpu_index, now)

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
        path = self.path_cost()
        return {
            "name": key[1],
            "namespace": key[0],
            "policy": "infless",
            "model": p.model,
            "profiled": state.provisional_s is None,
            "profile": _profile_note(state),
            "sloMs": p.slo_s * 1000,
            "bestEffort": p.best_effort,
            "rps": round(state.rps, 3),
            "case": state.case,
            "rMin": sum(i.r_low for i in state.instances),
            "rMax": sum(i.r_up for i in state.instances),
            "capacity": {
                "predictedRps": sum(i.r_up for i in state.instances),
                "observedRps": None if state.observed is None else round(state.observed, 1),
                "completedRps": round(state.done_rps, 1),
                "correction": round(state.correction, 3),
                "pathCpuCorrection": round(state.path_correction, 3),
                "pathCostMs": None
                if path is None
                else {"fixed": path.fixed_s * 1000, "perRequest": path.per_item_s * 1000},
            },
            "keepAlive": {
                "policy": p.keepalive.name,
                "scaleZero": p.scale_zero,
                "prewarmS": state.windows[0],
                "keepAliveS": state.windows[1],
            },
            "instances": [i.to_json() for i in state.instances],
        }


def _r_max(instances: list[Instance]) -> float:
    return sum(i.r_up for i in instances)


def _config(i: Instance) -> tuple[int, float, float]:
    return (i.candidate.batch, i.candidate.cpu, i.candidate.gpu)


def _configs(instances: list[Instance]) -> list[tuple[int, float, float]]:
    return sorted(_config(i) for i in instances)


def _profile_note(state: InflessState) -> str | None:
    """What `describe` says about the function's profile: None once planned from one."""
    if state.problem is not None:
        return state.problem
    if state.provisional_s is None:
        return None
    return (
        f"model {state.policy.model!r} is not profiled yet: served on a conservative plan (a batch of one assumed to "
        f"take {state.provisional_s * 1000:.0f} ms, a quarter of the SLO; batches grow under load within the SLO) "
        "until `faas-gpu profile` stores a profile (`faas-gpu up` runs it in the background); re-planned then"
    )
