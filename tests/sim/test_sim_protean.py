"""PROTEAN's simulator (faas_gpu.sim.protean): small clusters, short traces, fixed seeds."""

import numpy as np
import pytest

from faas_gpu.sim.protean import SCHEMES, SpotSetting, Workload, simulate
from faas_gpu.sim.protean_trace import batch_arrivals, bursty_trace, diurnal_trace

BE = ("shufflenet_v2", "densenet121", "dpn92", "vgg19")


@pytest.fixture(scope="module")
def loaded():
    """2 GPUs at 1,500 req/s mean (as loaded as 8 at 6,000), 50/50, a day in 120 s."""
    trace = diurnal_trace(1500.0, 120.0)
    return {s: simulate(s, Workload(trace, "resnet50", BE), nodes=2) for s in SCHEMES}


def test_traces_keep_their_scale_and_batches_follow_the_rate():
    d, b = diurnal_trace(5000.0, 600.0), bursty_trace(5000.0, 600.0)
    assert d.mean_rps == pytest.approx(5000.0) and d.duration_s == pytest.approx(600.0)
    assert b.peak_rps == pytest.approx(5000.0) and b.peak_rps / b.mean_rps > 1.5

    t = batch_arrivals(d, 0.5, 128, np.random.default_rng(1))
    assert len(t) == pytest.approx(5000.0 * 600 * 0.5 / 128, rel=0.02)
    assert (np.diff(t) >= 0).all() and t[-1] < 600.0


def test_every_batch_is_served_and_light_load_meets_every_slo():
    trace = diurnal_trace(400.0, 60.0)
    for scheme in SCHEMES:
        r = simulate(scheme, Workload(trace, "resnet50", BE), nodes=2)
        assert r.strict_slo_pct == 100.0, scheme
        assert len(r.strict_latency_s) and len(r.be_latency_s)
        assert (r.strict_latency_s < float("inf")).all() and (r.be_latency_s < float("inf")).all()


def test_the_same_seed_gives_the_same_run():
    trace = diurnal_trace(800.0, 30.0)
    a = simulate("protean", Workload(trace, "resnet50", BE), nodes=2, seed=5).summary()
    b = simulate("protean", Workload(trace, "resnet50", BE), nodes=2, seed=5).summary()
    assert a == b


def test_under_load_protean_keeps_strict_slos_that_the_baselines_miss(loaded):
    p = loaded["protean"]
    assert p.strict_slo_pct >= 95.0
    for scheme in ("molecule_beta", "infless_llama", "naive_slicing"):
        assert p.strict_slo_pct > loaded[scheme].strict_slo_pct, scheme
        assert p.summary()["strict_p99_ms"] < loaded[scheme].summary()["strict_p99_ms"], scheme


def test_protean_reconfigures_and_the_static_schemes_do_not(loaded):
    assert loaded["protean"].reconfigurations > 0
    assert all(loaded[s].reconfigurations == 0 for s in ("molecule_beta", "infless_llama", "naive_slicing"))
    assert set(loaded["naive_slicing"].geometry_time) == {("4g", "3g")}


def test_spot_with_on_demand_backup_keeps_slos_that_spot_only_loses():
    trace = diurnal_trace(1200.0, 120.0)
    w = Workload(trace, "resnet50", BE)
    plenty = simulate("protean", w, nodes=2, spot=SpotSetting(0.0))
    assert plenty.cost["spot_share"] == 1.0 and plenty.cost["normalized"] == pytest.approx(0.3)
    hybrid = simulate("protean", w, nodes=2, spot=SpotSetting(0.708))
    spot_only = simulate("protean", w, nodes=2, spot=SpotSetting(0.708, "spot-only"))
    assert hybrid.strict_slo_pct > spot_only.strict_slo_pct
    assert spot_only.cost["normalized"] < hybrid.cost["normalized"] < 1.0


def test_an_unknown_scheme_is_refused_by_name():
    with pytest.raises(ValueError, match="scheme"):
        simulate("fastest", Workload(diurnal_trace(100.0, 10.0), "resnet50", BE))
