"""HarmonyBatch's Table I (VGG-19; SLOs 0.5 / 0.8 / 1.0 s; 5 / 10 / 20 req/s), exactly as the
reference implementation computes it (shared data: harmonybatch/table1_repro.txt)."""

import pytest

from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.harmony import ALIBABA_FC_CNY, App, Options, plan
from faas_gpu.policy_data.harmony import load_model, load_platform

DATA = SHARED_DATA / "harmonybatch"
APPS = [App("app0", 0.5, 5.0), App("app1", 0.8, 10.0), App("app2", 1.0, 20.0)]


@pytest.fixture(scope="module")
def vgg():
    return load_model(DATA / "model.json", "VGG19")


@pytest.fixture(scope="module")
def platform():
    return load_platform(DATA / "config.json")


def plans(vgg, platform, options):
    return {s: plan(APPS, vgg, ALIBABA_FC_CNY, s, platform, options) for s in ("batch", "mbs", "harmony")}


def shape(p):
    return [
        (g.kind, round(g.provision.vcpu, 2) if g.kind == "cpu" else g.provision.gpu_gb, g.batch,
         [round(t, 3) for t in g.provision.timeouts] if g.batch > 1 else [0],
         [(a.name, round(a.rate, 3)) for a in g.apps])
        for g in p.groups
    ]  # fmt: skip


def test_table1_normalised_costs_are_the_reference_runs(vgg, platform):
    p = plans(vgg, platform, Options.reference())
    base = p["batch"].cost_per_request
    assert base == pytest.approx(3.9395e-05, rel=1e-4)
    assert p["mbs"].cost_per_request == pytest.approx(3.4730e-05, rel=1e-4)
    assert p["harmony"].cost_per_request == pytest.approx(2.5032e-05, rel=1e-4)
    assert round(p["mbs"].cost_per_request / base, 3) == 0.882
    assert round(p["harmony"].cost_per_request / base, 3) == 0.635


def test_table1_plans_are_the_reference_runs(vgg, platform):
    p = plans(vgg, platform, Options.reference())
    assert shape(p["batch"]) == [
        ("cpu", 1.55, 1, [0], [("app0", 5.0)]),
        ("cpu", 1.5, 2, [0.285], [("app1", 10.0)]),
        ("cpu", 1.5, 2, [0.485], [("app2", 20.0)]),
    ]
    assert shape(p["mbs"]) == [
        ("cpu", 1.5, 1, [0], [("app0", 5.0), ("app1", 10.0), ("app2", 2.5)]),
        ("gpu", 2, 11, [0.658], [("app2", 17.5)]),
    ]
    assert shape(p["harmony"]) == [
        ("cpu", 1.6, 1, [0], [("app0", 5.0)]),
        ("gpu", 2, 13, [0.454, 0.654], [("app1", 10.0), ("app2", 20.0)]),
    ]
    # the paper's notation of the same plans
    assert [g.label() for g in p["harmony"].groups] == ["(1.60, 1, [0])c", "(2, 13, [0.454, 0.654])g"]


def test_with_eq5_as_printed_harmony_batches_one_more_and_mbs_merges_all(vgg, platform):
    """The paper's Eq. 5 gives a longer equivalent timeout than the authors' code: b = 14, not 13."""
    p = plans(vgg, platform, Options())
    assert shape(p["harmony"])[1][:3] == ("gpu", 2, 14)
    assert shape(p["mbs"]) == [("gpu", 2, 11, [0.158, 0.458, 0.658], [("app0", 5.0), ("app1", 10.0), ("app2", 20.0)])]
    base = p["batch"].cost_per_request
    assert p["harmony"].cost_per_request / base == pytest.approx(0.601, abs=0.001)
    assert p["harmony"].cost_per_request < p["mbs"].cost_per_request < base
