"""The simulator replays arrivals against plans: batching by the per-app timeouts, modelled latency, billing."""

import numpy as np
import pytest

from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.harmony import ALIBABA_FC_CNY, App, Group, Plan, plan
from faas_gpu.policy_data.harmony import load_model, load_platform
from faas_gpu.sim.harmony import (
    TraceApp,
    load_app_trace,
    poisson_arrivals,
    replay,
    simulate_group,
    simulate_plan,
)

DATA = SHARED_DATA / "harmonybatch"
VGG = load_model(DATA / "model.json", "VGG19")
PLATFORM = load_platform(DATA / "config.json")
TABLE1 = [App("app0", 0.5, 5.0), App("app1", 0.8, 10.0), App("app2", 1.0, 20.0)]


def gpu_group() -> Group:
    return plan(TABLE1, VGG, ALIBABA_FC_CNY, "harmony", PLATFORM).groups[1]  # app1 + app2 on 2 GB, b = 14


def test_a_full_batch_leaves_at_its_last_arrival_and_a_partial_one_at_the_deadline():
    g = gpu_group()
    b, (t1, t2) = g.batch, g.provision.timeouts
    full = [np.array([]), np.linspace(0.0, 0.01, b)]  # b requests of app2 within 10 ms
    r = simulate_group(g, full, VGG, ALIBABA_FC_CNY, np.random.default_rng(0), noise=False)
    assert (r.requests, r.batches) == (b, 1)
    lone = [np.array([0.0]), np.array([])]  # one app1 request: waits its own timeout
    r = simulate_group(g, lone, VGG, ALIBABA_FC_CNY, np.random.default_rng(0), noise=False)
    assert r.batches == 1 and r.violations == 0
    # an app2 request opens the buffer (deadline t2); an app1 request at 0.1 s brings it to 0.1 + t1
    two = [np.array([0.1]), np.array([0.0])]
    r = simulate_group(g, two, VGG, ALIBABA_FC_CNY, np.random.default_rng(0), noise=False)
    assert r.batches == 1
    run = VGG.gpu.latency_avg(2, 2, g.provision.vcpu)
    assert r.cost == pytest.approx(ALIBABA_FC_CNY.invocation_cost(run, g.provision.vcpu, g.provision.memory_gb, 2))
    assert t1 < t2


def test_without_noise_a_harmony_plan_keeps_every_slo():
    p = plan(TABLE1, VGG, ALIBABA_FC_CNY, "harmony", PLATFORM)
    rng = np.random.default_rng(1)
    arrivals = {a.name: poisson_arrivals(a.rate, 120.0, np.random.default_rng(i)) for i, a in enumerate(TABLE1)}
    r = simulate_plan(p, arrivals, VGG, ALIBABA_FC_CNY, rng, noise=False)
    assert r.requests == sum(len(v) for v in arrivals.values())
    assert r.violations == 0
    assert r.cost_per_request == pytest.approx(p.cost_per_request, rel=0.25)


def test_batch_misses_slos_once_latency_varies_and_harmony_hardly_does():
    # BATCH sizes the 0.3 s app by its average latency (1.55 vCPU: 0.277 s avg, 0.364 s max)
    apps = [TraceApp("tight", 0.3, (4.0,) * 3), TraceApp("loose", 0.6, (8.0,) * 3)]
    res = {}
    for s in ("batch", "harmony"):
        res[s] = replay(apps, lambda cur, s=s: plan(cur, VGG, ALIBABA_FC_CNY, s, PLATFORM), VGG, ALIBABA_FC_CNY,
                        range(3), window_s=60.0, seed=5)  # fmt: skip
    assert res["batch"].requests == res["harmony"].requests  # the same arrivals for both
    assert res["batch"].violation_rate > 0.05
    assert res["harmony"].violation_rate < 0.01
    assert res["batch"].per_app["tight"][1] > 0.1 * res["batch"].per_app["tight"][0]


def test_replay_is_deterministic_and_splits_mbs_shares():
    apps = [TraceApp(a.name, a.slo, (a.rate,)) for a in TABLE1]

    def planner(cur):
        return plan(cur, VGG, ALIBABA_FC_CNY, "mbs", PLATFORM)

    a = replay(apps, planner, VGG, ALIBABA_FC_CNY, [0], window_s=60.0, seed=3)
    b = replay(apps, planner, VGG, ALIBABA_FC_CNY, [0], window_s=60.0, seed=3)
    assert (a.requests, a.violations, a.cost) == (b.requests, b.violations, b.cost)
    assert set(a.per_app) == {"app0", "app1", "app2"}
    assert a.per_app["app2"][0] == pytest.approx(20 * 60, rel=0.1)


def test_requests_for_an_app_the_plan_does_not_serve_are_an_error():
    with pytest.raises(ValueError, match="ghost"):
        simulate_plan(Plan("harmony", ()), {"ghost": np.array([1.0])}, VGG, ALIBABA_FC_CNY, np.random.default_rng(0))


def test_app_traces_load_as_rates_per_second():
    rates = load_app_trace(DATA / "app_traces" / "app1.csv")
    assert len(rates) == 120
    assert rates[0] == pytest.approx(467 / 60)
