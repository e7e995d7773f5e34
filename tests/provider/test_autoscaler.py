"""The provider's autoscaler driving INFless's policies: validation, non-uniform scale-up, release,
bounds, the weighted split and keep-alive, over a real embedded datastore and history.

The runtime here only records the plans it is given (the real one is exercised end to end in
tests/e2e/test_infless_e2e.py); the predictor is a table of latencies, as a profile store holds them.
"""

from collections import Counter

import pytest

from faas_gpu.datastore.embedded import EmbeddedDatastore
from faas_gpu.history import EmbeddedHistory
from provider.scaling import InflessScaling, ScalingRouter
from provider.scaling.infless import MIN_AGE_S
from provider.types import FunctionDeployment, FunctionRecord, ValidationError
from tests.provider.scaling_fakes import TABLE, Clock, PlanRecorder, TablePredictor


@pytest.fixture
def scaler(tmp_path):
    ds = EmbeddedDatastore(tmp_path / "state.db")
    history = EmbeddedHistory(tmp_path / "history.db")
    clock, wall = Clock(), Clock(1_700_000_000.0)
    replicas = {}
    infless = InflessScaling(ds, history, TablePredictor({"cnn": TABLE}), cpus=8, wall=wall, window_s=5.0)
    a = ScalingRouter(
        PlanRecorder(), [infless], set_replicas=lambda ns, n, r: replicas.__setitem__((ns, n), r), clock=clock
    )
    a.replicas, a.fake_clock, a.fake_wall, a.ds, a.history = replicas, clock, wall, ds, history
    a.predictor = infless.predictor
    yield a
    history.close()
    ds.close()


def record(annotations, labels=None, replicas=1):
    dep = FunctionDeployment.from_json(
        {"service": "fn", "image": "img", "annotations": annotations, "labels": labels or {}}
    )
    return FunctionRecord(dep, "openfaas-fn", replicas)


def load(a, key, rps, seconds):
    """`rps` arrivals a second for `seconds`, one autoscaler tick a second."""
    for _ in range(int(seconds)):
        for _ in range(int(rps)):
            a.arrived(key)
        a.fake_clock.t += 1
        a.fake_wall.t += 1
        a.tick()


def test_functions_without_a_model_are_not_managed(scaler):
    r = record({"com.faas-gpu.slo-ms": "100"})
    assert scaler.validate(r) is None
    scaler.prepare(r)
    assert not scaler.manages(r.key)


def test_a_model_without_a_profile_is_refused_naming_it_and_the_command(scaler):
    with pytest.raises(ValidationError, match=r"com.faas-gpu.model.*'resnet'.*faas-gpu profile"):
        scaler.validate(record({"com.faas-gpu.model": "resnet", "com.faas-gpu.slo-ms": "100"}))


def test_an_slo_below_the_best_predicted_latency_is_refused_with_the_figure(scaler):
    with pytest.raises(ValidationError, match=r"com.faas-gpu.slo-ms: 3 ms .* 4.8 ms"):
        scaler.validate(record({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "3"}))
    best_effort = record({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "3", "com.faas-gpu.best-effort": "true"})
    scaler.prepare(best_effort)
    assert len(scaler.describe(best_effort.key)["instances"]) == 1


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        ({"com.faas-gpu.model": "cnn"}, "com.faas-gpu.slo-ms"),
        ({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "fast"}, "com.faas-gpu.slo-ms"),
        ({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "-5"}, "com.faas-gpu.slo-ms"),
        ({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100", "com.faas-gpu.keep-alive": "x"}, "keep-alive"),
    ],
)
def test_bad_annotations_name_the_field(scaler, annotations, field):
    with pytest.raises(ValidationError, match=field):
        scaler.validate(record(annotations))


def test_rising_load_adds_instances_of_different_batch_sizes_and_falling_load_releases_them(scaler):
    r = record({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"}, {"com.openfaas.scale.max": "10"})
    scaler.prepare(r)
    first = scaler.describe(r.key)["instances"]
    assert [i["batch"] for i in first] == [1]
    load(scaler, r.key, 400, 8)
    d = scaler.describe(r.key)
    batches = {i["batch"] for i in d["instances"]}
    assert len(batches) >= 2, d
    assert d["rMax"] >= 400
    assert sum(i["cpu"] for i in d["instances"]) <= 8
    plan = scaler.runtime.plans[r.key]
    assert {s.env["FAAS_GPU_MAX_BATCH"] for s in plan} == {str(b) for b in batches}
    assert all(float(s.env["FAAS_GPU_BATCH_TIMEOUT_MS"]) <= 100 for s in plan)
    assert scaler.replicas[r.key] == len(plan)
    peak = len(d["instances"])
    scaler.fake_clock.t += MIN_AGE_S
    load(scaler, r.key, 20, 8)
    d = scaler.describe(r.key)
    assert 1 <= len(d["instances"]) < peak
    assert d["rMax"] >= 20


def test_scale_bounds_hold(scaler):
    r = record(
        {"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"},
        {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "3"},
    )
    scaler.prepare(r)
    assert len(scaler.describe(r.key)["instances"]) == 2
    load(scaler, r.key, 5000, 5)
    assert len(scaler.describe(r.key)["instances"]) == 3
    scaler.fake_clock.t += MIN_AGE_S
    load(scaler, r.key, 0, 10)
    assert len(scaler.describe(r.key)["instances"]) == 2
    scaler.scale_to(r.key, 50)
    assert len(scaler.describe(r.key)["instances"]) == 3


def test_requests_are_split_in_the_dispatched_proportions(scaler):
    r = record({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"}, {"com.openfaas.scale.max": "10"})
    scaler.prepare(r)
    load(scaler, r.key, 400, 8)
    d = scaler.describe(r.key)
    ready = [(i["id"], f"http://{i['id']}") for i in d["instances"]]
    picks = Counter(scaler.pick(r.key, ready) for _ in range(10_000))
    total = sum(i["rate"] for i in d["instances"])
    for inst in d["instances"]:
        share = picks[f"http://{inst['id']}"] / 10_000
        assert share == pytest.approx(inst["rate"] / total, abs=0.01)


def test_the_plan_survives_a_provider_restart(scaler, tmp_path):
    r = record({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"}, {"com.openfaas.scale.max": "10"})
    scaler.prepare(r)
    load(scaler, r.key, 400, 8)
    before = [(i["id"], i["batch"]) for i in scaler.describe(r.key)["instances"]]
    infless = InflessScaling(scaler.ds, scaler.history, scaler.predictor, cpus=8)
    again = ScalingRouter(PlanRecorder(), [infless], set_replicas=lambda *a: None)
    again.prepare(r)
    assert [(i["id"], i["batch"]) for i in again.describe(r.key)["instances"]] == before


def test_scale_zero_releases_an_idle_function_after_keep_alive_and_prewarms_it(scaler):
    r = record(
        {
            "com.faas-gpu.model": "cnn",
            "com.faas-gpu.slo-ms": "100",
            "com.faas-gpu.keep-alive": "lsth",
            "com.faas-gpu.scale-zero": "true",
        },
    )
    scaler.prepare(r)
    name = "openfaas-fn/fn"
    start_min = int(scaler.fake_wall.t // 60)
    for m in range(start_min - 24 * 60, start_min, 10):  # a day of calls every 10 minutes
        scaler.history.record(name, m * 60.0)
    scaler.fake_wall.t = (start_min - 10) * 60.0 + 1  # just after the last call
    counts = []
    for _ in range(10 * 60 // 15):  # until the next predicted call
        scaler.fake_wall.t += 15
        scaler.fake_clock.t += 15
        scaler.tick()
        counts.append(len(scaler.describe(r.key)["instances"]))
    ka = scaler.describe(r.key)["keepAlive"]
    assert ka["prewarmS"] == 9 * 60
    assert 0 in counts  # released while idle
    first_zero = counts.index(0)
    assert 1 in counts[first_zero:]  # started again before the next predicted call
    assert counts[-1] == 1
