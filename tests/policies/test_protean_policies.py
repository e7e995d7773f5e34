"""PROTEAN's pure policies (seed 000): MIG geometries, classes, Eq. 2, Alg. 1, Alg. 2, scaling, procurement."""

import csv

import pytest

from faas_gpu.cloud import EmulatedCloud
from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.protean import (
    Batch,
    ClassQueue,
    CostMeter,
    EvictionNotice,
    FunctionLoad,
    GpuObservation,
    InvalidGeometry,
    JobDistributor,
    NodeKind,
    NodeState,
    PriceSeries,
    Procurement,
    ProcurementSnapshot,
    ProteanScaling,
    ReconfigSettings,
    Reconfigurator,
    RequestClass,
    ScaleSnapshot,
    SliceState,
    classify,
    eta,
    parse_class,
    parse_slo_ms,
    tag_slices,
)
from faas_gpu.policies.protean.slowdown import mlperf_rdf_1g, width_from_rdf_1g
from faas_gpu.policy_data.protean import default_assumptions, gpu_model

MLPERF = SHARED_DATA / "mlperf_v1.1_a100_mig_calibration.csv"
A100 = gpu_model("A100-40GB")


# -- MIG geometries as data ------------------------------------------------------------------


def test_the_paper_geometries_are_valid_and_normalized_largest_first():
    assert A100.validate(["1g", "2g", "4g"]) == ("4g", "2g", "1g")
    assert A100.validate("4g+3g") == ("4g", "3g")
    assert A100.validate(["7g"]) == ("7g",)
    assert ("4g", "3g") in A100.valid_geometries()
    assert ("1g",) * 7 in A100.valid_geometries()


@pytest.mark.parametrize(
    ("geometry", "reason"),
    [(["4g", "4g"], "at most 1"), (["4g", "3g", "1g"], "compute slices"), (["5g"], "unknown profile")],
)
def test_an_invalid_geometry_is_refused_with_the_reason_and_the_valid_ones(geometry, reason):
    with pytest.raises(InvalidGeometry) as err:
        A100.validate(geometry)
    assert reason in str(err.value)
    assert ("4g", "3g") in err.value.valid_geometries and "(4g, 3g)" in str(err.value)


def test_placement_rules_refuse_what_fits_by_count_but_not_by_position():
    # 3g + 3g + 1g is 7 compute slices, but two 3g take both halves and leave no memory slice
    assert not A100.is_valid(["3g", "3g", "1g"])
    assert A100.is_valid(["3g", "3g"])


def test_h100_has_its_own_memory_per_profile():
    h100 = gpu_model("H100-80GB")
    assert h100.memory_mb("3g") == 2 * A100.memory_mb("3g")
    assert ("4g", "3g") in h100.valid_geometries() and h100.memory_mb("1g.20gb") == 20480


# -- request classes and the reordering queue ------------------------------------------------


def test_headers_choose_the_class_and_a_tighter_slo():
    assert classify({"x-faas-gpu-class": "best-effort"}, default_slo_ms=300).request_class is RequestClass.BEST_EFFORT
    c = classify({"X-Faas-Gpu-Slo-Ms": "120"}, default_slo_ms=300)
    assert (c.request_class, c.slo_ms, c.deadline(10.0)) == (RequestClass.STRICT, 120.0, 10.12)
    assert classify({}, default_slo_ms=300).slo_ms == 300


@pytest.mark.parametrize("bad", ["urgent", "strict!", "1"])
def test_a_class_that_does_not_parse_names_the_header(bad):
    with pytest.raises(ValueError, match="X-Faas-Gpu-Class"):
        parse_class(bad)


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "inf", "nan"])
def test_an_slo_that_does_not_parse_names_the_header(bad):
    with pytest.raises(ValueError, match="X-Faas-Gpu-Slo-Ms"):
        parse_slo_ms(bad)


def test_a_strict_request_without_any_slo_is_refused():
    with pytest.raises(ValueError, match="needs an SLO"):
        classify({"X-Faas-Gpu-Class": "strict"})


def test_strict_before_best_effort_earliest_deadline_first():
    q: ClassQueue[str] = ClassQueue(be_max_wait_s=5.0)
    q.push("be1", 0.0)
    q.push("late", 0.1, deadline=0.9)
    q.push("be2", 0.2)
    q.push("soon", 0.3, deadline=0.5)
    assert [e.item for e in q.drain(1.0)] == ["soon", "late", "be1", "be2"]


def test_best_effort_is_not_starved_beyond_its_bound():
    q: ClassQueue[str] = ClassQueue(be_max_wait_s=1.0)
    q.push("be", 0.0)
    for i in range(5):
        q.push(f"s{i}", 0.5, deadline=2.0 + i)
    assert q.pop(0.9) == "s0"  # waited 0.9 s: strict still first
    assert q.pop(1.1) == "be"  # waited past the bound: served next
    assert q.pop(1.2) == "s1"


def test_overdue_best_effort_takes_at_most_its_share_while_strict_work_waits():
    q: ClassQueue[str] = ClassQueue(be_max_wait_s=1.0, be_share=0.25)
    for i in range(8):
        q.push(f"be{i}", 0.0)
        q.push(f"s{i}", 5.0, deadline=10.0 + i)
    served = [q.pop(6.0) for _ in range(11)]  # every best-effort entry is overdue at t = 6
    assert [x[0] for x in served] == list("bsssbsssbss")  # one in four while both wait
    assert [q.pop(6.0) for _ in range(5)] == ["be3", "be4", "be5", "be6", "be7"]  # strict gone: all theirs
    with pytest.raises(ValueError, match="be_share"):
        ClassQueue(be_share=0.0)


# -- the slowdown model (Eq. 2) --------------------------------------------------------------


def test_eta_is_rdf_times_the_bandwidth_oversubscription():
    assert eta(1.5, 0.3) == 1.5
    assert eta(1.5, 0.6, [0.3]) == 1.5
    assert eta(1.5, 0.6, [0.3, 0.3]) == pytest.approx(1.8)
    with pytest.raises(ValueError, match="rdf"):
        eta(0, 0.5)


def test_widths_are_calibrated_from_the_mlperf_figures():
    with MLPERF.open() as f:
        rdf = mlperf_rdf_1g(csv.DictReader(f))
    assert rdf["resnet50"]["SingleStream"] == pytest.approx(0.653786 / 0.462809)
    assert rdf["bert-99"]["Offline"] == pytest.approx(3614 / 502.39)
    anchors = default_assumptions().raw["calibration"]["width_anchors"]
    assert anchors["vision"]["w_lo"] == pytest.approx(width_from_rdf_1g(rdf["resnet50"]["SingleStream"]), abs=1e-3)
    assert anchors["language"]["w_lo"] == pytest.approx(width_from_rdf_1g(rdf["bert-99"]["SingleStream"]), abs=1e-3)


def test_small_slices_slow_wide_batches_and_not_narrow_ones():
    sd = default_assumptions().slowdown
    assert sd.rdf("vgg19", "7g") == 1.0
    w = sd.spec("vgg19").width
    assert sd.rdf("vgg19", "1g") == pytest.approx(7.0 * w)  # a batch of width w: w / (1/7) on a 1g
    assert sd.rdf("shufflenet_v2", "7g") == 1.0
    assert 1.0 <= sd.rdf("shufflenet_v2", "3g") < sd.rdf("vgg19", "3g")
    assert sd.eta("resnet50", "4g", ["vgg19"]) > sd.eta("resnet50", "4g", ["shufflenet_v2"])


def test_every_assumed_number_says_where_it_comes_from():
    a = default_assumptions()
    for section in ("policy", "simulator"):
        for name, entry in a.raw[section].items():
            assert entry.get("source") in {"paper", "assumed", "calibrated"}, f"{section}.{name}"
            assert entry.get("why"), f"{section}.{name}"


# -- Job Distribution (Alg. 1) ---------------------------------------------------------------


def slices(*profiles: str) -> list[SliceState]:
    return [SliceState(p, p, A100.memory_mb(p)) for p in profiles]


def test_tags_fill_the_smallest_slices_first():
    sd = default_assumptions().slowdown
    tags = tag_slices(slices("4g", "2g", "1g"), be_mem_mb=12 * 1024, slowdown=sd)
    assert tags == {"1g": 1.0, "2g": pytest.approx(0.7), "4g": 0.0}


def test_best_effort_is_packed_first_fit_into_the_smallest_slices():
    sd = default_assumptions().slowdown
    be = [Batch(i, "shufflenet_v2", False, 2048) for i in range(4)]
    d = JobDistributor(sd).distribute(be, slices("4g", "2g", "1g"))
    assert [p.slice for p in d.placements] == ["1g", "1g", "2g", "2g"]


def test_a_strict_batch_goes_to_the_least_eta_slice_not_fully_tagged():
    sd = default_assumptions().slowdown
    strict = Batch("s", "resnet50", True, 5 * 1024, slack_s=1.0)
    be = [Batch(i, "vgg19", False, 10 * 1024) for i in range(2)]
    d = JobDistributor(sd).distribute([strict, *be], slices("4g", "2g", "1g"), be_model="vgg19")
    placed = {p.batch.id: p.slice for p in d.placements}
    assert placed["s"] == "4g"  # 1g and 2g are tagged for the BE work, and smaller
    assert d.placements[0].eta == pytest.approx(sd.eta("resnet50", "4g"))


def test_without_strict_work_best_effort_takes_the_least_eta_slice():
    sd = default_assumptions().slowdown
    be = Batch("b", "vgg19", False, 10 * 1024)
    packed = JobDistributor(sd).distribute([be], slices("4g", "2g", "1g"))
    spread = JobDistributor(sd).distribute([be], slices("4g", "2g", "1g"), strict_expected=False)
    assert packed.placements[0].slice == "2g"  # Guideline 1: the smallest slice that fits
    assert spread.placements[0].slice == "4g"  # no strict work to keep the 4g for


def test_a_batch_that_fits_nowhere_waits():
    sd = default_assumptions().slowdown
    d = JobDistributor(sd).distribute([Batch("big", "vgg19", True, 30 * 1024)], slices("4g", "3g"))
    assert [b.id for b in d.waiting] == ["big"] and not d.placements


# -- the GPU Reconfigurator (Alg. 2) ---------------------------------------------------------


def obs(gpu, geometry, be, model="vgg19", busy=False):
    return GpuObservation(gpu, geometry, be, model, busy)


def test_target_geometry_follows_the_best_effort_memory():
    r = Reconfigurator(default_assumptions().slowdown)
    assert r.target_geometry(0.0, None) == ("4g", "3g")  # no BE: below T_low, consolidate
    assert r.target_geometry(1.2, "shufflenet_v2") == ("4g", "2g", "1g")  # fits (2g, 1g)
    assert r.target_geometry(1.9, "vgg19") == ("4g", "3g")  # > 90% of (2g, 1g): onto a 3g
    assert r.target_geometry(5.0, "vgg19") == ("4g", "3g")  # fits no small set: the fallback


def test_a_mismatch_reconfigures_only_after_the_wait_limit():
    r = Reconfigurator(default_assumptions().slowdown, ReconfigSettings(ewma_alpha=1.0, wait_limit=3))
    current = ("4g", "2g", "1g")
    decisions = [r.observe([obs(0, current, 3.0)], now=float(t)) for t in range(4)]
    assert [len(d.reconfigure) for d in decisions] == [0, 0, 0, 1]
    rc = decisions[-1].reconfigure[0]
    assert (rc.current, rc.target, rc.drain_first, rc.reconfig_s) == (current, ("4g", "3g"), True, 2.0)


def test_a_passing_blip_resets_the_wait_counter():
    r = Reconfigurator(default_assumptions().slowdown, ReconfigSettings(ewma_alpha=1.0, wait_limit=3))
    current = ("4g", "2g", "1g")
    loads = [3.0, 3.0, 1.2, 3.0, 3.0, 3.0]  # the third interval matches the current geometry
    out = [
        len(r.observe([obs(0, current, be, "vgg19" if be > 2 else "shufflenet_v2")], float(t)).reconfigure)
        for t, be in enumerate(loads)
    ]
    assert out == [0, 0, 0, 0, 0, 0]


def test_at_most_30_percent_of_gpus_reconfigure_at_once():
    r = Reconfigurator(default_assumptions().slowdown, ReconfigSettings(ewma_alpha=1.0, wait_limit=0))
    gpus = [obs(i, ("4g", "2g", "1g"), 3.0) for i in range(10)]
    d = r.observe(gpus, 0.0)
    assert len(d.reconfigure) == 3 and len(d.held_by_cap) == 7
    busy = [obs(i, ("4g", "2g", "1g"), 3.0, busy=i < 3) for i in range(10)]
    assert len(r.observe(busy, 1.0).reconfigure) == 0  # three are still reconfiguring


def test_the_prediction_is_an_ewma():
    r = Reconfigurator(default_assumptions().slowdown, ReconfigSettings(ewma_alpha=0.5))
    assert r.predict("g", 4.0) == (4.0, 0.0)
    assert r.predict("g", 0.0) == (2.0, 0.0)
    assert r.predict("g", 0.0) == (1.0, 0.0)


# -- autoscaling (§4.2) ----------------------------------------------------------------------


def load(waiting, running=0, containers=0, batch=8):
    return ScaleSnapshot({"f": FunctionLoad("f", batch, waiting, running, containers)})


def test_one_container_per_batch_on_scale_up():
    d = ProteanScaling(600).observe(load(waiting=20, running=1, containers=1), now=0.0)
    assert d.desired["f"] == 1 + 3 and d.scale_up["f"] == 3


def test_surplus_containers_stop_only_after_the_whole_window():
    p = ProteanScaling(surplus_window_s=600)
    assert p.observe(load(0, containers=5), 0.0).desired["f"] == 5
    assert p.observe(load(8, containers=5), 300.0).desired["f"] == 5  # 1 needed: surplus 4, still counting
    d = p.observe(load(0, containers=5), 600.0)
    assert d.terminate == {"f": 4} and d.desired["f"] == 1
    p2 = ProteanScaling(surplus_window_s=600)
    p2.observe(load(0, containers=5), 0.0)
    p2.observe(load(40, containers=5), 100.0)  # a burst needs them all: the surplus ends
    assert p2.observe(load(0, containers=5), 650.0).terminate == {}


def test_scaling_bad_input_names_the_field():
    with pytest.raises(ValueError, match="batch_size"):
        ProteanScaling().observe(load(1, batch=0), 0.0)
    with pytest.raises(ValueError, match="surplus_window_s"):
        ProteanScaling(-1)


# -- procurement (§4.5) ----------------------------------------------------------------------


def node(id, kind=NodeKind.SPOT, ready=True, cordoned=False, idle=False):
    return NodeState(id, kind, ready, cordoned, idle)


def test_an_eviction_notice_cordons_the_node_and_buys_spot_first():
    p = Procurement(target_nodes=2)
    notice = EvictionNotice("a", 10.0, 70.0)
    d = p.observe(ProcurementSnapshot([node("a"), node("b")], [notice]), 10.0)
    assert d.cordon == ["a"] and d.acquire == [NodeKind.SPOT]


def test_on_demand_when_spot_fails_and_release_once_drained():
    p = Procurement(target_nodes=2, spot_retry_s=60)
    p.observe(ProcurementSnapshot([node("a"), node("b")], [EvictionNotice("a", 0.0, 60.0)]), 0.0)
    d = p.observe(ProcurementSnapshot([node("a", idle=True), node("b")], failed=[NodeKind.SPOT]), 1.0)
    assert d.acquire == [NodeKind.ON_DEMAND] and d.release == ["a"]


def test_spot_only_never_buys_on_demand_and_on_demand_mode_never_buys_spot():
    snap = ProcurementSnapshot([node("b")], failed=[NodeKind.SPOT])
    assert Procurement(2, mode="spot-only").observe(snap, 0.0).acquire == []
    assert Procurement(2, mode="on-demand").observe(ProcurementSnapshot([]), 0.0).acquire == [NodeKind.ON_DEMAND] * 2
    with pytest.raises(ValueError, match="mode"):
        Procurement(2, mode="cheap")


def test_cost_meter_prices_spot_by_the_series_and_on_demand_flat():
    prices = PriceSeries((0.1, 0.3), step_s=1800.0)
    m = CostMeter(prices, on_demand_per_hour=1.0)
    assert m.add(NodeKind.SPOT, 0.0, 3600.0) == pytest.approx(0.2)
    assert m.add(NodeKind.ON_DEMAND, 0.0, 1800.0) == pytest.approx(0.5)
    assert m.total == pytest.approx(0.7) and m.on_demand_equivalent() == pytest.approx(1.5)


def test_the_emulated_cloud_is_deterministic_and_evicts_at_p_rev():
    def history(seed, p_rev):
        c = EmulatedCloud(seed, p_rev, boot_s=0.0)
        nodes = [c.acquire(NodeKind.SPOT, 0.0) for _ in range(20)]
        notices = c.eviction_notices(600.0)
        return [n.id for n in nodes if n], [(n.node, n.evict_at - n.noticed_at) for n in notices]

    assert history(4, 0.354) == history(4, 0.354)
    assert history(4, 0.0)[1] == []
    nodes, notices = history(4, 0.708)
    assert len(nodes) < 20 and notices  # scarce spot capacity, and notices
    assert all(30.0 <= lead <= 120.0 for _, lead in notices)  # notices 30-120 s ahead
    with pytest.raises(ValueError, match="p_rev"):
        EmulatedCloud(1, 1.5)
