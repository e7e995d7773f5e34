"""`faas-gpu profile --path`'s parts that need no stack: the store, the probe's deployment, the
model time subtracted, a point's path seconds (the live run is tests/e2e/test_path_cost_e2e.py)."""

import pytest

from faas_gpu.profiling.cli import _model_ms
from faas_gpu.profiling.path import PathPoint, probe_deployment
from faas_gpu.profiling.predictor import LatencyPredictor
from faas_gpu.profiling.store import ProfileStore


def test_the_store_keeps_the_path_cost_per_node_and_the_predictor_answers_it(tmp_path):
    with ProfileStore(tmp_path / "profiles.db") as store:
        assert LatencyPredictor(store).path_cost("vm") is None
        store.put_path_cost("vm", 2.5, 1.25, "[]")
        store.put_path_cost("vm", 2.0, 1.0, "[]")  # measured again: replaced
        assert LatencyPredictor(store).path_cost("vm") == (2.0, 1.0)
        assert store.path_cost("other") is None
        with pytest.raises(ValueError):
            store.put_path_cost("vm", -1.0, 1.0)


def test_the_probe_batches_as_told_and_is_not_sized_by_infless():
    fn = {
        "name": "classify",
        "image": "img",
        "envVars": {"A": "1"},
        "annotations": {"com.faas-gpu.model": "resnet-mini", "com.faas-gpu.slo-ms": "250", "other": "x"},
    }
    dep = probe_deployment(fn, 8, timeout_ms=20)
    assert dep["image"] == "img" and dep["annotations"] == {"other": "x"}
    assert dep["envVars"] == {"A": "1", "FAAS_GPU_MAX_BATCH": "8", "FAAS_GPU_BATCH_TIMEOUT_MS": "20"}


def test_the_model_time_is_interpolated_between_profiled_batches(tmp_path):
    with ProfileStore(tmp_path / "profiles.db") as store:
        for b, ms in ((1, 1.0), (8, 8.0), (16, 12.0)):
            store.put_model("m", b, 1, "cpu", 0, ms)
        at = _model_ms(LatencyPredictor(store), "m")
        assert at(1) == 1.0 and at(4) == pytest.approx(4.0) and at(12) == pytest.approx(10.0)
        assert at(32) == pytest.approx(24.0)  # past the last: per image as there


def test_a_point_is_what_the_batch_took_beyond_the_model():
    p = PathPoint(batch_cap=8, mean_batch=8.0, rps=400.0, model_s=0.004)
    assert p.path_s == pytest.approx(0.016)
    assert PathPoint(1, 1.0, 0.0, 0.001).path_s == 0.0
