"""The simulator drives the daemons' own objects (issue 18): for each decision the daemons make,
the simulator builds the same class through the same factory, and asks it the same way.

- PROTEAN's admission: the class queue (`admission_queue`, with `be_max_wait_s` and `be_share`)
  and the order it admits in (`admit`), in `scheduler.admission` and `faas_gpu.sim.protean`;
- PROTEAN's Job Distribution: the `JobDistributor` (`job_distributor`) and LALB-O3's
  `JobDistributionPreference`, in the scheduler daemon and the simulator's PROTEAN serving;
- INFless's scaling: the rate window (`rate_window`) and the keep-alive `warm` rule, in
  `provider.scaling.infless` and `faas_gpu.sim.infless`.

A sim module that imported the class but built it its own way, or re-coded the rule, would
pass an identity check on the class alone; the tests also check that the factories are the ones
both sides import and that the sim's runs go through them.
"""

from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import pytest

import faas_gpu.sim.infless.infless_system as sim_infless
import faas_gpu.sim.infless.keepalive_replay as sim_keepalive
import faas_gpu.sim.protean.dispatcher as sim_dispatcher
import faas_gpu.sim.protean.serving as sim_serving
import faas_gpu.sim.protean.simulation as sim_protean
import provider.scaling.infless as live_infless
import provider.scaling.infless_spec as live_infless_spec
import scheduler.admission as live_admission
import scheduler.daemon as live_daemon
import scheduler.distribution as live_distribution
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


@pytest.mark.parametrize(
    ("prewarm", "keep", "since", "expected"),
    [(0, 300, 10, True), (0, 300, 301, False), (600, 120, 30, True), (600, 120, 300, False), (600, 120, 700, True)],
)
def test_warm_rule(prewarm, keep, since, expected):
    assert keepalive.warm(keepalive.Windows(prewarm, keep), since) is expected
