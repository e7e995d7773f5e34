"""The planner's contract: pure, JSON-able plans, clear errors for SLOs nothing can meet."""

import json
import math

import pytest

from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.harmony import (
    ALIBABA_FC_CNY,
    PAPER_PRICES,
    App,
    InfeasibleSLOError,
    Options,
    Platform,
    plan,
    provisioner,
)
from faas_gpu.policies.harmony.baselines import partition
from faas_gpu.policy_data.harmony import load_model, load_models, load_platform

DATA = SHARED_DATA / "harmonybatch"
VGG = load_model(DATA / "model.json", "VGG19")
PLATFORM = load_platform(DATA / "config.json")
TWELVE = [
    App(f"app{i + 1}", round(0.2 + 0.8 * i / 11, 3), [3.9, 7.4, 16.5, 2.1][i % 4] * (1 + i / 10)) for i in range(12)
]


@pytest.mark.parametrize("strategy", ["harmony", "batch", "mbs"])
def test_an_slo_nothing_meets_raises_with_the_best_latency(strategy):
    apps = [App("ok", 0.8, 5.0), App("impossible", 0.002, 5.0)]
    with pytest.raises(InfeasibleSLOError) as e:
        plan(apps, VGG, ALIBABA_FC_CNY, strategy, PLATFORM)
    err = e.value
    assert isinstance(err, ValueError)
    assert err.app == "impossible" and err.slo_s == 0.002
    if strategy == "batch":  # BATCH is CPU only, with latency taken as the average
        assert err.best_latency_s == pytest.approx(VGG.cpu.latency_avg(16.0, 1))
    else:  # the whole GPU, batch 1: Eq. 2's L0
        assert err.best_latency_s == pytest.approx(VGG.gpu.base_latency(1))
    assert f"{err.best_latency_s * 1000:.1f} ms" in str(err)
    assert err.best_latency_s > err.slo_s


def test_an_slo_only_a_gpu_meets_goes_to_a_gpu():
    # below VGG-19's CPU floor (gamma_max of batch 1 is 0.249 s), above its GPU latency
    p = plan([App("tight", 0.2, 4.0)], VGG, ALIBABA_FC_CNY, "harmony", PLATFORM)
    assert p.groups[0].kind == "gpu"
    assert p.groups[0].provision.latency_max_s <= 0.2


@pytest.mark.parametrize("strategy", ["harmony", "batch", "mbs"])
def test_the_planner_is_pure(strategy):
    apps = list(TWELVE)
    first = plan(apps, VGG, ALIBABA_FC_CNY, strategy, PLATFORM).to_dict()
    again = plan(apps, VGG, ALIBABA_FC_CNY, strategy, PLATFORM).to_dict()
    provisioner.cache_clear()  # nothing cached changes the answer
    fresh = plan(apps, VGG, ALIBABA_FC_CNY, strategy, PLATFORM).to_dict()
    shuffled = plan(apps[::-1], VGG, ALIBABA_FC_CNY, strategy, PLATFORM).to_dict()
    assert first == again == fresh == shuffled
    assert apps == TWELVE  # the input is left alone


def test_a_plan_is_json_and_covers_every_request():
    p = plan(TWELVE, VGG, ALIBABA_FC_CNY, "harmony", PLATFORM)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["strategy"] == "harmony"
    served = {}
    for g in d["groups"]:
        assert g["instance"] in ("cpu", "gpu")
        assert (g["gpu_memory_gb"] > 0) == (g["instance"] == "gpu")
        assert len(g["timeouts_s"]) == len(g["apps"])
        for a, t in zip(g["apps"], g["timeouts_s"], strict=True):
            served[a["name"]] = served.get(a["name"], 0) + a["rate_rps"]
            assert 0 <= t <= a["slo_s"] - g["latency_max_s"] + 1e-9  # Constraint (10)
        assert g["cost_per_second"] == pytest.approx(g["cost_per_request"] * sum(a["rate_rps"] for a in g["apps"]))
    assert served == pytest.approx({a.name: a.rate for a in TWELVE})
    assert d["cost_per_second"] == pytest.approx(sum(g["cost_per_second"] for g in d["groups"]))


def test_harmony_never_costs_more_than_one_group_per_app():
    """Merges are kept only when cheaper, so Alg. 1 ends at or below its starting point."""
    from faas_gpu.policies.harmony import harmony

    for name, model in load_models(DATA / "model.json").items():
        slos = [1.0 + 0.2 * i for i in range(8)] if name in ("GPT-2", "VideoMAE") else [0.2 + 0.1 * i for i in range(8)]
        apps = [App(f"a{i}", s, r) for i, (s, r) in enumerate(zip(slos, [3, 7, 16, 2, 4, 8, 5, 40], strict=True))]
        groups, trace = harmony(apps, provisioner(model, ALIBABA_FC_CNY, PLATFORM))
        assert trace == sorted(trace, reverse=True)
        assert sum(g.cost_per_second for g in groups) == pytest.approx(trace[-1])
        assert sorted(a.name for g in groups for a in g.apps) == sorted(a.name for a in apps)


def test_harmony_groups_are_runs_of_adjacent_slos():
    p = plan(TWELVE, VGG, ALIBABA_FC_CNY, "harmony", PLATFORM)
    order = [a.name for g in p.groups for a in g.apps]
    assert order == [a.name for a in sorted(TWELVE, key=lambda a: a.slo)]


def test_mbs_splits_the_requests_evenly():
    apps = [App("a", 0.5, 5.0), App("b", 0.8, 10.0), App("c", 1.0, 20.0)]
    parts = partition(apps, 2)
    assert [[(x.name, x.rate) for x in s] for s in parts] == [[("a", 5.0), ("b", 10.0), ("c", 2.5)], [("c", 17.5)]]
    three = partition(apps, 3)
    assert [sum(x.rate for x in s) for s in three] == pytest.approx([35 / 3] * 3)
    assert partition(apps, 1) == [apps]


def test_zero_rate_apps_are_planned():
    apps = [App("idle", 0.5, 0.0), App("busy", 1.0, 20.0)]
    for s in ("harmony", "batch", "mbs"):
        p = plan(apps, VGG, ALIBABA_FC_CNY, s, PLATFORM)
        assert {a.name for g in p.groups for a in g.apps} == {"idle", "busy"}
        assert math.isfinite(p.cost_per_request)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="strategy"):
        plan([App("a", 1.0, 1.0)], VGG, ALIBABA_FC_CNY, "fastest")
    with pytest.raises(ValueError, match="distinct"):
        plan([App("a", 1.0, 1.0), App("a", 0.5, 1.0)], VGG, ALIBABA_FC_CNY)
    with pytest.raises(ValueError, match="SLO"):
        App("a", 0.0, 1.0)
    with pytest.raises(ValueError, match="timeout_formula"):
        plan([App("a", 1.0, 1.0)], VGG, ALIBABA_FC_CNY, options=Options(timeout_formula="guess"))
    assert plan([], VGG, ALIBABA_FC_CNY).groups == ()


def test_gpu_latency_follows_eq3_and_eq4():
    g = VGG.gpu
    l0 = g.xi1 * 13 + g.xi2
    assert g.latency_avg(2, 13) == pytest.approx(24 / 2 * l0)  # Eq. 3
    slices = math.ceil(l0 / (2 * g.tau))
    assert g.latency_max(2, 13) == pytest.approx(((24 - 2) * slices * g.tau + l0) * 1.2)  # Eq. 4, padded
    assert g.latency_max(24, 13) == pytest.approx(l0)  # the whole GPU: no slicing, no padding
    assert g.memory_need_gb(1) == 2  # model.json: VGG19's gpu_mem [0]


def test_loaders_read_the_reference_files():
    models = load_models(DATA / "model.json")
    assert set(models) == {"Bert", "GPT-2", "VGG19", "VideoMAE"}
    assert models["Bert"].gpu.host_share == pytest.approx(0.57)
    assert models["VideoMAE"].gpu.memory_need_gb(5) == 3
    assert PLATFORM == Platform()  # config.json holds the paper's ranges
    with pytest.raises(KeyError, match="ResNet"):
        load_model(DATA / "model.json", "ResNet")


def test_the_papers_prices_make_every_app_a_gpu_app():
    """With Eq. 6 as printed (no memory, no per-second GPU billing) the whole cost of a GPU function
    falls with its batch only (Eq. 16); VGG-19 then never stays on CPU."""
    p = plan(TWELVE, VGG, PAPER_PRICES, "harmony", PLATFORM)
    assert all(g.kind == "gpu" for g in p.groups)
