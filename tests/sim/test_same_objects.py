"""The simulator drives the daemons' own objects (issue 18): for each decision the daemons make,
the simulator builds the same class through the same factory, and asks it the same way.

- PROTEAN's admission: the class queue (`admission_queue`, with `be_max_wait_s` and `be_share`)
  and the order it admits in (`admit`), in `scheduler.admission` and `faas_gpu.sim.protean`;
- PROTEAN's placement: LALB-O3 from `make_scheduler` over the slices of every node, with the
  `JobDistributor` (`job_distributor`) as its `JobDistributionPreference`, in the scheduler
  daemon and the simulator's PROTEAN serving;
- INFless's scaling: the rate window (`rate_window`) and the keep-alive `warm` rule, in
  `provider.scaling.infless` and `faas_gpu.sim.infless`;
- HarmonyBatch's live pools: `AppPools` (`app_pools`: the per-app rate window, the re-plan rule,
  the pools and their copies under a floor), in `provider.scaling.harmony` and
  `faas_gpu.sim.harmony.replay_live`.

A sim module that imported the class but built it its own way, or re-coded the rule, would
pass an identity check on the class alone; the tests also check that the factories are the ones
both sides import and that the sim's runs go through them.
"""

from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import faas_gpu.sim.harmony as sim_harmony
import faas_gpu.sim.infless.infless_system as sim_infless
import faas_gpu.sim.infless.keepalive_replay as sim_keepalive
import faas_gpu.sim.protean.dispatcher as sim_dispatcher
import faas_gpu.sim.protean.serving as sim_serving
import faas_gpu.sim.protean.simulation as sim_protean
import provider.scaling.harmony as live_harmony
import provider.scaling.infless as live_infless
import provider.scaling.infless_spec as live_infless_spec
import scheduler.admission as live_admission
import scheduler.daemon as live_daemon
import scheduler.distribution as live_distribution
import scheduler.loop as live_loop
import scheduler.units as live_units
from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.harmony import pools
from faas_gpu.policies.infless import keepalive
from faas_gpu.policies.infless.rate import RateWindow, rate_window
from faas_gpu.policies.lalb_job_distribution import JobDistributionPreference
from faas_gpu.policies.protean import classes, distribution
from faas_gpu.policy_data.protean import default_assumptions
from faas_gpu.sim.infless import INFlessSystem
from faas_gpu.sim.protean import Workload, simulate
from faas_gpu.sim.protean.simulation import ProteanSim
from faas_gpu.sim.protean_trace import diurnal_trace

BE = ("shufflenet_v2", "densenet121")


def _sim(scheme: str = "protean") -> ProteanSim:
    return ProteanSim(scheme, Workload(diurnal_trace(400.0, 10.0), "resnet50", BE), nodes=1)


# -- PROTEAN's admission ---------------------------------------------------------------------


def test_the_class_queue_comes_from_one_factory_on_both_sides():
    assert live_admission.admission_queue is classes.admission_queue
    assert sim_protean.admission_queue is classes.admission_queue
    assert sim_dispatcher.admission_queue is classes.admission_queue  # a withdrawn node's new queue
    live = live_admission.Admission(None, None, threading.Condition(), lambda: 0.0)  # type: ignore[arg-type]
    node = _sim()._add_node()
    assert type(live.queue) is type(node.queue) is classes.ClassQueue
    # the sim's queue caps overdue best-effort work with the daemon's default share (not ClassQueue's 1.0)
    assert node.queue.be_share == live.queue.be_share == classes.BE_SHARE
    assert node.queue.be_max_wait_s == default_assumptions().setting("policy", "be_max_wait_s")


def test_both_admit_in_the_queue_order_through_admit():
    assert live_admission.admit is classes.admit
    assert sim_serving.admit is classes.admit
    assert "admit(self.queue" in inspect.getsource(live_admission.Admission.admit)
    assert "admit(q, now" in inspect.getsource(sim_serving.ProteanServing._admit)
    # neither re-codes the overdue rule: only ClassQueue reads be_max_wait_s to order entries
    assert ".be_max_wait_s" not in inspect.getsource(sim_serving)


# -- PROTEAN's Job Distribution ----------------------------------------------------------------


def test_the_distributor_comes_from_one_factory():
    assert "job_distributor(" in inspect.getsource(live_daemon._Daemon.load)
    assert sim_protean.job_distributor is distribution.job_distributor
    a = default_assumptions()
    daemon = distribution.job_distributor(a)  # what `--distribution protean` builds
    paper = _sim("protean_paper").serving.distributor  # type: ignore[attr-defined]
    assert type(paper) is type(daemon) is distribution.JobDistributor
    assert vars(paper) == vars(daemon)  # the simulator's protean_paper is the daemon's Alg. 1
    extended = _sim("protean").serving.distributor  # type: ignore[attr-defined]
    assert vars(extended) == vars(distribution.job_distributor(a, extended=True))


def test_placement_asks_the_daemons_job_distribution_preference(monkeypatch):
    assert sim_serving.JobDistributionPreference is live_distribution.JobDistributionPreference
    assert live_distribution.JobDistributionPreference is JobDistributionPreference
    built: list[type] = []
    asked = [0]
    init, choose = JobDistributionPreference.__init__, JobDistributionPreference.choose

    def spy_init(self, *args, **kw):
        built.append(type(self))
        init(self, *args, **kw)

    def spy_choose(self, batch, idle):
        asked[0] += 1
        return choose(self, batch, idle)

    monkeypatch.setattr(JobDistributionPreference, "__init__", spy_init)
    monkeypatch.setattr(JobDistributionPreference, "choose", spy_choose)
    r = simulate("protean", Workload(diurnal_trace(400.0, 10.0), "resnet50", BE), nodes=1)
    assert built and set(built) == {JobDistributionPreference}
    assert asked[0] >= len(r.strict_latency_s) + len(r.be_latency_s)  # every batch started was placed by it


def test_placement_is_lalb_o3_from_the_schedulers_factory_across_nodes(monkeypatch):
    """The PROTEAN simulation places as the live scheduler does: one LALB-O3 from `make_scheduler`
    (the factory the scheduler's unit view calls) over the slices of every node, with Alg. 1's
    `JobDistributionPreference` as its unit preference, asked by LALB itself."""
    from faas_gpu.policies import lalb

    assert live_units.make_scheduler is lalb.make_scheduler
    assert sim_serving.make_scheduler is lalb.make_scheduler
    assert "make_scheduler(" in inspect.getsource(live_units.UnitView.rebuild)
    assert "make_scheduler(" in inspect.getsource(sim_serving.ProteanServing._lalb)
    assert "unit_preference = " in inspect.getsource(live_loop.PlacementLoop.round)
    assert "unit_preference = " in inspect.getsource(sim_serving.ProteanServing._round)
    built: list[type] = []
    nodes_used: set[int] = set()
    asked = [0]
    factory, schedule, call = lalb.make_scheduler, lalb.LALBScheduler.schedule, JobDistributionPreference.__call__

    def spy_factory(name, units, *args, **kw):
        policy = factory(name, units, *args, **kw)
        built.append(type(policy))
        assert name == "lalb_o3" and policy.o3_limit > 0
        return policy

    def spy_schedule(self, now):
        out = schedule(self, now)
        if isinstance(self.unit_preference, JobDistributionPreference):
            nodes_used.update(self.units[d.unit].node for d in out)
        return out

    def spy_call(self, request, idle):
        asked[0] += 1
        return call(self, request, idle)

    monkeypatch.setattr(sim_serving, "make_scheduler", spy_factory)
    monkeypatch.setattr(lalb.LALBScheduler, "schedule", spy_schedule)
    monkeypatch.setattr(JobDistributionPreference, "__call__", spy_call)
    r = simulate("protean", Workload(diurnal_trace(2000.0, 10.0), "resnet50", BE), nodes=3)
    assert built and set(built) == {lalb.LALBScheduler}
    assert asked[0] > 0  # LALB-O3 asked Alg. 1's preference
    assert nodes_used == {0, 1, 2}  # one LALB-O3 placed on the slices of every node
    assert r.strict_slo_pct > 0


# -- INFless's scaling -----------------------------------------------------------------------


def test_the_rate_window_comes_from_one_factory_and_measures_alike():
    assert live_infless.rate_window is rate_window
    assert live_infless_spec.rate_window is rate_window
    assert sim_infless.rate_window is rate_window
    system = INFlessSystem.__new__(INFlessSystem)  # only its measurement is exercised
    system.windows, system.arrived = {}, {}
    fn = SimpleNamespace(name="f")
    live_state = SimpleNamespace(rate_window=rate_window(5.0))
    steps = [0, 10, 10, 40, 0, 0, 5, 100, 100, 0, 0, 0, 0, 0, 0]
    arrived, sim_rates, live_rates = 0.0, [], []
    for t, rps in enumerate(steps):
        sim_rates.append(system.measure(fn, rps, float(t)))  # type: ignore[arg-type]
        arrived += rps
        live_rates.append(live_infless.InflessScaling._measure(None, live_state, arrived, float(t)))  # type: ignore[arg-type]
    assert type(system.windows["f"]) is type(live_state.rate_window) is RateWindow
    assert sim_rates == live_rates
    assert steps[4] == 0 and sim_rates[4] > 0  # after a dip the window still sees the load, as the daemon does


def test_the_keep_alive_warm_rule_is_written_once():
    assert live_infless.warm is keepalive.warm
    assert sim_infless.warm is keepalive.warm
    assert sim_keepalive.warm is keepalive.warm
    for module in (live_infless, sim_infless):
        assert "prewarm_s + " not in inspect.getsource(module)  # not re-coded next to the call


def test_the_keep_alive_policy_of_an_annotation_is_built_in_one_place():
    """The provider (from `com.faas-gpu.keep-alive`) and `faas-gpu replay`'s simulator side build
    LSTH, HHP or a fixed window through `keepalive_policy`: the same objects with the same settings."""
    import faas_gpu.sim.replay as sim_replay

    assert live_infless_spec.keepalive_policy is keepalive.keepalive_policy
    assert sim_replay.keepalive_policy is keepalive.keepalive_policy
    for raw in ("lsth", "hhp", "fixed:5m"):
        assert live_infless_spec._keepalive(raw) == keepalive.keepalive_policy(raw)
    assert "LongShortTermHistogram(" not in inspect.getsource(live_infless_spec)


@pytest.mark.parametrize(
    ("prewarm", "keep", "since", "expected"),
    [(0, 300, 10, True), (0, 300, 301, False), (600, 120, 30, True), (600, 120, 300, False), (600, 120, 700, True)],
)
def test_warm_rule(prewarm, keep, since, expected):
    assert keepalive.warm(keepalive.Windows(prewarm, keep), since) is expected


def test_both_count_the_keep_alive_from_the_last_call_and_hold_calls_in_flight():
    """Issue 46: the keep-alive window is counted from the last call itself and calls in flight keep
    the function warm; the provider and the simulator hand `warm` the same inputs."""
    assert "since_call_s=idle_s, in_flight=in_flight" in inspect.getsource(live_infless.InflessScaling._keep_alive)
    assert "since_call_s=since_call, in_flight=0" in inspect.getsource(sim_infless.INFlessSystem._warm_window)
    sim = INFlessSystem.__new__(INFlessSystem)
    sim.last_call, sim.sim = {"f": 100.0}, SimpleNamespace(active={"f": [1]})  # a call at 1:40
    fn = SimpleNamespace(name="f")
    w = keepalive.Windows(0.0, 20.0)
    assert sim._warm_window(fn, w, 115.0)  # 15 s after the call, 55 s after its minute began
    assert not sim._warm_window(fn, w, 125.0)


# -- HarmonyBatch's live pools -------------------------------------------------------------


def test_the_live_pools_come_from_one_factory_on_both_sides():
    assert live_harmony.app_pools is pools.app_pools
    assert sim_harmony.app_pools is pools.app_pools
    assert "app_pools(" in inspect.getsource(live_harmony.HarmonyPools.state_of)
    assert "app_pools(" in inspect.getsource(sim_harmony.replay_live)
    # neither re-codes the rate window, the re-plan rule or the copies next to the call
    for module in (live_harmony, sim_harmony):
        src = inspect.getsource(module)
        assert "samples.popleft" not in src and "0.25 *" not in src and "busiest.copies" not in src


def _harmony_case():
    from faas_gpu.policies.harmony import ALIBABA_FC_CNY, plan
    from faas_gpu.policy_data.harmony import load_models

    model = load_models(SHARED_DATA / "harmonybatch" / "model.json")["VGG19"]
    slos = {"a": 0.5, "b": 0.8, "c": 1.0}

    def planner(apps):
        return plan(apps, model, ALIBABA_FC_CNY, "harmony")

    return model, slos, planner, ALIBABA_FC_CNY


def test_the_simulator_and_the_provider_decide_alike_on_the_same_counts(monkeypatch):
    """The provider's HarmonyPools and `replay_live` fed the same cumulative counts per app, tick
    by tick, build the same AppPools and apply the same plans at the same times."""
    from faas_gpu.sim.harmony import TraceApp

    model, slos, planner, prices = _harmony_case()
    built: list[pools.AppPools] = []
    init = pools.AppPools.__init__

    def spy_init(self, *args, **kw):
        init(self, *args, **kw)
        built.append(self)

    monkeypatch.setattr(pools.AppPools, "__init__", spy_init)
    minutes = [0, 1, 2, 3]
    rates = {"a": (2.0, 2.0, 12.0, 0.5), "b": (8.0, 8.0, 2.0, 2.0), "c": (10.0, 30.0, 30.0, 1.0)}
    apps = [TraceApp(n, slos[n], rates[n]) for n in slos]
    result, replans = sim_harmony.replay_live(apps, planner, model, prices, minutes, 30.0, seed=3)
    sim_pools = built[-1]
    assert type(sim_pools) is pools.AppPools and replans == sim_pools.replans >= 2  # it re-planned as load moved
    assert result.requests > 0

    # the provider, on the counts the simulator measured (one sample per tick), decides the same
    policy = live_harmony.HarmonyPools(None, gpu_path=False)
    live = pools.app_pools("fn", slos, window_s=policy.window_s, plan_period_s=policy.plan_period_s)
    assert (live.window_s, live.plan_period_s) == (sim_pools.window_s, sim_pools.plan_period_s)
    state = live_harmony._State(SimpleNamespace(name="fn"), model, "harmony", slos, live)  # type: ignore[arg-type]
    monkeypatch.setattr(policy, "_plan", lambda st: planner(st.live.planned_apps(st.slos)))
    policy._apply(state, planner(live.planned_apps(slos)), 0.0)
    assert type(state.live) is type(sim_pools)
    rng = np.random.default_rng(0)
    counts = dict.fromkeys(slos, 0)
    sim_twin = pools.app_pools("fn", slos)
    sim_twin.apply(planner(sim_twin.planned_apps(slos)), 0.0)
    for t in range(1, 121):
        minute = (t - 1) // 30
        for n in slos:
            counts[n] += int(rng.poisson(rates[n][minute]))
        ctx = SimpleNamespace(state=state, now=float(t), load=SimpleNamespace(by_app=dict(counts)))
        policy.decide(ctx)  # type: ignore[arg-type]
        sim_twin.measure(float(t), counts)
        sim_twin.replan(float(t), lambda: planner(sim_twin.planned_apps(slos)))
        assert state.live.rates == sim_twin.rates
        assert state.live.plan == sim_twin.plan and state.live.replans == sim_twin.replans
    assert state.live.replans >= 2
    # a scale request's floor spreads copies the same way on both sides
    policy.scale_to(SimpleNamespace(state=state), len(state.pools) + 3)  # type: ignore[arg-type]
    sim_twin.spread(len(sim_twin.pools) + 3)
    assert [p.instance_ids for p in state.pools] == [p.instance_ids for p in sim_twin.pools]


# -- GPU-FaaS placement, as `faas-gpu replay` compares it with the live stack --------------------


def test_the_replay_simulator_builds_placement_and_admission_as_the_scheduler_does(monkeypatch):
    """`faas-gpu replay`'s simulator side (`engine.simulate(admission=True)`) builds the policy with
    the scheduler's factory, queues requests in the daemon's class queue, and hands the policy the
    same look-ahead (`LookAhead`) the daemon's admission does, asked on every admission."""
    from faas_gpu.policies import lalb
    from faas_gpu.sim import engine
    from faas_gpu.sim.replay import Profile, simulate_side
    from faas_gpu.sim.scenario import Cluster

    assert live_units.make_scheduler is lalb.make_scheduler is engine.make_scheduler
    assert live_admission.LookAhead is lalb.LookAhead is engine.LookAhead
    assert engine.admission_queue is classes.admission_queue and engine.admit is classes.admit
    assert "LookAhead(policy" in inspect.getsource(live_admission.Admission.admit)
    built: list[str] = []
    windows: list[type] = []
    factory, init = lalb.make_scheduler, lalb.LookAhead.__init__

    def spy_factory(name, *args, **kw):
        built.append(name)
        return factory(name, *args, **kw)

    def spy_init(self, *args, **kw):
        windows.append(type(self))
        init(self, *args, **kw)

    monkeypatch.setattr(engine, "make_scheduler", spy_factory)
    monkeypatch.setattr(lalb.LookAhead, "__init__", spy_init)
    profiles = {"a": Profile(40.0, 0.5, 0.1), "b": Profile(40.0, 0.5, 0.1)}
    arrivals = [(0.05 * i, "ab"[i % 2]) for i in range(20)]
    for policy in ("lb", "lalb", "lalb_o3"):
        side = simulate_side(arrivals, profiles, Cluster(1, 2, 64.0), policy, 25, 0.0)
        assert all(o.latency_s is not None for o in side.outcomes)
    assert built == ["lb", "lalb", "lalb_o3"]
    assert windows and set(windows) == {lalb.LookAhead}
