"""HarmonyBatch in the provider: a function's applications grouped onto CPU or GPU instance pools.

An application is a request class of a function: the function declares its apps and their SLOs
(`com.faas-gpu.apps: "search=500,feed=800,reports=1000"`), requests name theirs by header
(`X-Faas-Gpu-App`, or `X-Faas-Gpu-Slo-Ms`: the app with the loosest SLO that still meets it),
and the latency/cost coefficients of the function's model come from a `model.json`-format file
(`com.faas-gpu.harmony-model` names the entry). Every `plan_period_s` the planner runs on the
rates observed per app and its plan is applied: one pool per group, each instance with the
group's batch size and per-app batch timeouts. A CPU group runs the model in its instances with
the group's vCPU as threads (no GPU Manager call); a GPU group's instances call the GPU Manager
through the scheduler. The gateway routes each request to a pool that holds its app.

It is one of the provider's scaling policies (the router hands it the functions that declare
apps), so one loop decides for every function.

A scale request (`POST /system/scale-function`, `faas-cli scale`) sets a floor on the number of
instances: the plan's pools run as before and the instances beyond one per pool are copies of
the busiest pools (each copy takes an equal part of its pool's rates), so `replicas` reads what
serves. A request below the number of pools leaves one instance per pool: every app keeps the
pool its SLO was planned for. The floor holds across re-plans until the next scale request.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.contract import env as contract_env
from faas_gpu.contract.headers import APP as APP_HEADER
from faas_gpu.contract.headers import SLO_MS as SLO_HEADER
from faas_gpu.contract.slo import parse_slo_ms
from faas_gpu.policies.harmony import (
    ALIBABA_FC_CNY,
    STRATEGIES,
    AppPools,
    InfeasibleSLOError,
    ModelCoefficients,
    Options,
    Plan,
    Pool,
    app_pools,
    plan,
)
from faas_gpu.policies.infless import WeightedSplitter
from faas_gpu.policy_data.harmony import load_models

from ..runtime import InstanceSpec
from ..types import FunctionRecord, ValidationError
from ..validation import APP_NAME_RE, SCALE_ZERO_LABEL, zero_after_s
from .base import Key, ScalingContext, ScalingDecision
from .replicas import refuse_our_keep_alive

APPS = annotation_keys.APPS
MODEL = annotation_keys.HARMONY_MODEL
STRATEGY = annotation_keys.HARMONY_STRATEGY
_APP_NAME = APP_NAME_RE


class BadApp(ValueError):
    """A request whose app header names no app of the function (the gateway answers 400)."""


def parse_apps(raw: str) -> dict[str, float]:
    """`name=slo_ms,...` -> {name: slo seconds}."""
    apps: dict[str, float] = {}
    for item in raw.split(","):
        name, sep, ms = item.strip().partition("=")
        name = name.strip()
        if not sep or not _APP_NAME.match(name):
            raise ValidationError(f"annotations: {APPS} must be name=slo_ms pairs separated by commas, got {raw!r}")
        try:
            slo_ms = float(ms)
        except ValueError:
            raise ValidationError(f"annotations: {APPS}: SLO of app {name!r} must be in ms, got {ms!r}") from None
        if not math.isfinite(slo_ms) or slo_ms <= 0:
            raise ValidationError(f"annotations: {APPS}: SLO of app {name!r} must be positive, got {ms!r}")
        if name in apps:
            raise ValidationError(f"annotations: {APPS}: app {name!r} is declared twice")
        apps[name] = slo_ms / 1000
    return apps


@dataclass
class _State:
    """A function's HarmonyBatch state: its apps and model, and its live pools (`AppPools`, from
    `app_pools`: the rate window, the re-plan rule, the pools and their copies)."""

    record: FunctionRecord
    model: ModelCoefficients
    strategy: str
    slos: dict[str, float]
    live: AppPools
    splitters: dict[str, WeightedSplitter] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rates(self) -> dict[str, float]:
        return self.live.rates

    @property
    def plan(self) -> Plan | None:
        return self.live.plan

    @property
    def pools(self) -> list[Pool]:
        return self.live.pools

    @property
    def floor(self) -> int:
        return self.live.floor


class HarmonyPools:
    """HarmonyBatch's planner as a scaling policy: a function's apps grouped onto pools."""

    name = "harmonybatch"
    managed = True

    def __init__(
        self,
        coefficients: Path | None,
        *,
        gpu_path: bool,
        plan_period_s: float = 10.0,
        window_s: float = 30.0,
        options: Options | None = None,
    ):
        self.coefficients = coefficients
        self.gpu_path = gpu_path
        self.plan_period_s, self.window_s = plan_period_s, window_s
        # the authors' equivalent timeout and Alibaba FC prices: the configuration Table I reproduces
        self.options = options or Options.reference()
        self.prices = ALIBABA_FC_CNY

    @staticmethod
    def declares(record: FunctionRecord) -> bool:
        return APPS in (record.deployment.annotations or {})

    def _model(self, name: str) -> ModelCoefficients:
        if self.coefficients is None or not Path(self.coefficients).exists():
            raise ValidationError(
                f"annotations: {MODEL}: no HarmonyBatch coefficients file on this provider (start it with "
                "--harmony-coefficients model.json, in the format of HarmonyBatch's model.json)"
            )
        try:
            models = load_models(self.coefficients)
        except (OSError, ValueError, KeyError) as exc:
            raise ValidationError(f"annotations: {MODEL}: cannot read {self.coefficients}: {exc}") from None
        if name not in models:
            raise ValidationError(
                f"annotations: {MODEL}: model {name!r} is not in {self.coefficients} (has: {', '.join(sorted(models))})"
            )
        return models[name]

    def state_of(self, record: FunctionRecord) -> _State:
        """The function's apps, model and strategy, refused when no plan meets an app's SLO."""
        ann = record.deployment.annotations or {}
        slos = parse_apps(ann[APPS])
        if MODEL not in ann:
            raise ValidationError(f"annotations: {MODEL} is required with {APPS} (the model's coefficients)")
        strategy = ann.get(STRATEGY, "harmony")
        if strategy not in STRATEGIES:
            raise ValidationError(f"annotations: {STRATEGY} must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        live = app_pools(record.name, slos, window_s=self.window_s, plan_period_s=self.plan_period_s)
        state = _State(record, self._model(ann[MODEL]), strategy, slos, live)
        self._plan(state)  # an SLO no configuration meets is refused now, with the best latency
        return state

    def validate(self, record: FunctionRecord) -> None:
        if zero_after_s(record.deployment.labels) is not None:
            raise ValidationError(
                f"labels: {SCALE_ZERO_LABEL}: HarmonyBatch keeps a pool for every group of apps at all times; a "
                "function with com.faas-gpu.apps does not scale to zero"
            )
        refuse_our_keep_alive(record, "HarmonyBatch's pools (a pool per group, always)")
        self.state_of(record)

    def _plan(self, state: _State) -> Plan:
        apps = state.live.planned_apps(state.slos)
        try:
            return plan(apps, state.model, self.prices, state.strategy, options=self.options)
        except InfeasibleSLOError as exc:
            raise ValidationError(
                f"annotations: {APPS}: app {exc.app!r} has an SLO of {exc.slo_s * 1000:g} ms, but the best "
                f"latency model {state.model.name!r} can reach is {exc.best_latency_s * 1000:.0f} ms"
            ) from None

    # -- life cycle ------------------------------------------------------------------------
    def adopt(self, record: FunctionRecord, now: float, previous: _State | None) -> ScalingDecision:
        """Plan at once; an update with the same apps and model keeps the rates (and the floor)."""
        state = self.state_of(record)
        old = previous
        if old is not None and old.slos == state.slos and old.model == state.model:
            state.live.keep_from(old.live)
        return self._apply(state, self._plan(state), now)

    def forget(self, key: Key, *, deleted: bool) -> None:
        """Nothing is kept outside the state the router holds."""

    # -- the hot path ----------------------------------------------------------------------
    def app_of(self, state: _State, headers: dict[str, str] | None) -> str:
        headers = headers or {}
        name = headers.get(APP_HEADER)
        if name is not None:
            if name not in state.slos:
                raise BadApp(f"{APP_HEADER}: {name!r} is not an app of this function ({', '.join(state.slos)})")
            return name
        raw = headers.get(SLO_HEADER)
        if raw is not None:
            try:  # the gateway has checked it with the same parser; an empty one is still refused here
                slo_ms = parse_slo_ms(raw)
            except ValueError:
                slo_ms = None
            if slo_ms is None:
                raise BadApp(f"{SLO_HEADER}: must be a number of milliseconds, got {raw!r}")
            slo = slo_ms / 1000
            fits = [n for n, s in state.slos.items() if s <= slo]
            if not fits:
                raise BadApp(f"{SLO_HEADER}: no app of this function has an SLO within {raw} ms")
            return max(fits, key=lambda n: state.slos[n])
        return next(iter(state.slos))  # the first declared app is the default

    def arrived(self, key: Key, state: _State, headers: dict[str, str] | None) -> str | None:
        """Counted per app (the planner's input); BadApp when the request names none."""
        app = self.app_of(state, headers)
        if headers is not None:
            headers[APP_HEADER] = app  # the instance's batch queue times the call by its app
        return app

    def pick(self, state: _State, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        if not ready:
            return None
        app = self.app_of(state, headers)
        urls = dict(ready)
        with state.lock:
            splitter = state.splitters.get(app)
            candidates = [i for p in state.pools if app in p.apps for i in p.instance_ids if i in urls]
            if splitter is not None and candidates:
                return urls.get(splitter.pick(candidates))
        # the app's pool is still starting (a new plan): any instance runs the same model meanwhile
        return ready[hash(app) % len(ready)][1]

    # -- decisions -------------------------------------------------------------------------
    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        """Measure the rates per app; every plan period, re-plan and apply a plan that differs."""
        state: _State = ctx.state
        live = state.live
        live.measure(ctx.now, ctx.load.by_app)
        if live.due(ctx.now):
            new = self._replan(state)  # outside the lock: planning takes a while
            with state.lock:  # the hot path reads pools and splitters together
                applied = live.offer(new, ctx.now)
            if applied:
                self._spread(state)
        return self._decision(state)

    def _replan(self, state: _State) -> Plan | None:
        try:
            return self._plan(state)
        except ValidationError:
            return None  # keep the current plan; the deploy-time check vouched for one

    def scale_to(self, ctx: ScalingContext, n: int) -> ScalingDecision:
        """A floor on the instances, spread over the busiest pools (see the module's docstring)."""
        state: _State = ctx.state
        with state.lock:
            state.live.spread(n)
        self._spread(state)
        return self._decision(state)

    def scale_from_zero(self, ctx: ScalingContext) -> ScalingDecision:
        return self._decision(ctx.state)  # a plan always has a pool per group

    def applied(self, key: Key, state: _State) -> None:
        """The plan is re-made from the rates after a restart: nothing to keep."""

    def _apply(self, state: _State, new: Plan, now: float) -> ScalingDecision:
        with state.lock:  # the hot path reads pools and splitters together
            state.live.apply(new, now)
        self._spread(state)
        return self._decision(state)

    def _spread(self, state: _State) -> None:
        """The splitters weigh every instance with its part of its pool's rates (`AppPools.weights`)."""
        with state.lock:
            for app in state.slos:
                state.splitters.setdefault(app, WeightedSplitter()).set_weights(state.live.weights(app))

    def _decision(self, state: _State) -> ScalingDecision:
        specs = tuple(InstanceSpec(i, self._env(p)) for p in state.pools for i in p.instance_ids)
        return ScalingDecision(state, len(specs), specs)

    def _env(self, pool: Pool) -> dict[str, str]:
        g = pool.group
        names = [a["name"] for a in g["apps"]]
        timeouts = ",".join(f"{n}={t * 1000:.3f}" for n, t in zip(names, g["timeouts_s"], strict=True))
        env = {contract_env.MAX_BATCH.name: str(g["batch"]), contract_env.APP_TIMEOUTS_MS.name: timeouts}
        if g["instance"] == "cpu":
            env[contract_env.CPU_THREADS.name] = str(max(1, math.ceil(g["vcpu"])))
            env[contract_env.SCHEDULER_URL.name] = ""  # a CPU group runs its model in the instance
        else:
            env[contract_env.GPU_MEMORY_GB.name] = str(g["gpu_memory_gb"])
        return env

    def describe(self, ctx: ScalingContext) -> dict | None:
        state: _State = ctx.state
        key = state.record.key
        p = state.plan
        return {
            "name": key[1],
            "namespace": key[0],
            "policy": "harmonybatch",
            "strategy": state.strategy,
            "model": state.model.name,
            "apps": [
                {"name": n, "sloMs": s * 1000, "rate": round(state.rates.get(n, 0.0), 3)} for n, s in state.slos.items()
            ],
            "predictedCostPerRequest": p.cost_per_request if p else None,
            "predictedCostPerSecond": p.cost_per_second if p else None,
            "plan": p.to_dict() if p else None,
            "instances": [
                {
                    "id": iid,
                    "kind": pool.group["instance"],
                    "gpuPath": pool.group["instance"] == "gpu" and self.gpu_path,
                    "apps": sorted(pool.apps),
                    "batch": pool.group["batch"],
                    "vcpu": pool.group["vcpu"],
                    "gpuMemoryGb": pool.group["gpu_memory_gb"],
                    "timeoutsMs": {
                        a["name"]: round(t * 1000, 3)
                        for a, t in zip(pool.group["apps"], pool.group["timeouts_s"], strict=True)
                    },
                }
                for pool in state.pools
                for iid in pool.instance_ids
            ],
        }
