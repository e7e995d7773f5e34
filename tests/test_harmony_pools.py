"""HarmonyBatch in the provider without processes: annotations, app headers, plans applied as pools.

The runtime records the pools it is given (tests/test_harmony_e2e.py runs the real one); the
coefficients are VGG-19's from HarmonyBatch's model.json (see that test).
"""

import json

import pytest

from provider.harmony import BadApp, HarmonyPools, parse_apps
from provider.types import FunctionDeployment, FunctionRecord, ValidationError
from tests.test_harmony_e2e import VGG19


class PlanRecorder:
    def __init__(self):
        self.plans = {}

    def set_plan(self, namespace, name, plan):
        self.plans[(namespace, name)] = plan


@pytest.fixture
def pools(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"VGG19": VGG19}))
    return HarmonyPools(PlanRecorder(), path, set_replicas=lambda *a: None, gpu_path=True, plan_period_s=1)


def record(apps="search=500,feed=800,reports=1000", model="VGG19", **extra):
    ann = {"com.faas-gpu.apps": apps, "com.faas-gpu.harmony-model": model, **extra}
    return FunctionRecord(FunctionDeployment.from_json({"service": "fn", "image": "img", "annotations": ann}), "ns", 1)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("search", "name=slo_ms"),
        ("Search=5", "name=slo_ms"),
        ("a=fast", "must be in ms"),
        ("a=0", "must be positive"),
        ("a=5,a=6", "declared twice"),
    ],
)
def test_bad_app_declarations_name_the_annotation(raw, message):
    with pytest.raises(ValidationError, match=f"com.faas-gpu.apps.*{message}"):
        parse_apps(raw)


def test_missing_coefficients_and_unknown_models_are_refused(pools, tmp_path):
    with pytest.raises(ValidationError, match="harmony-model: model 'BERT' is not in .*VGG19"):
        pools.validate(record(model="BERT"))
    none = HarmonyPools(PlanRecorder(), tmp_path / "absent.json", set_replicas=lambda *a: None, gpu_path=False)
    with pytest.raises(ValidationError, match="--harmony-coefficients"):
        none.validate(record())
    with pytest.raises(ValidationError, match="harmony-strategy"):
        pools.validate(record(**{"com.faas-gpu.harmony-strategy": "greedy"}))


def test_requests_name_their_app_by_header_or_by_slo(pools):
    state = pools.validate(record())
    assert pools.app_of(state, {"X-Faas-Gpu-App": "feed"}) == "feed"
    assert pools.app_of(state, {"X-Faas-Gpu-Slo-Ms": "900"}) == "feed"  # the loosest SLO that still meets it
    assert pools.app_of(state, {"X-Faas-Gpu-Slo-Ms": "5000"}) == "reports"
    assert pools.app_of(state, {}) == "search"  # the first declared app
    with pytest.raises(BadApp, match="X-Faas-Gpu-App: 'nope'"):
        pools.app_of(state, {"X-Faas-Gpu-App": "nope"})
    with pytest.raises(BadApp, match="X-Faas-Gpu-Slo-Ms: no app"):
        pools.app_of(state, {"X-Faas-Gpu-Slo-Ms": "100"})
    with pytest.raises(BadApp, match="X-Faas-Gpu-Slo-Ms: must be"):
        pools.app_of(state, {"X-Faas-Gpu-Slo-Ms": "soon"})


def test_observed_rates_give_the_table_i_plan_and_pools_with_per_app_timeouts(pools):
    r = record()
    pools.prepare(r, now=0.0)
    for second in range(1, 31):
        for app, rate in (("search", 5), ("feed", 10), ("reports", 20)):
            for _ in range(rate):
                headers = {"X-Faas-Gpu-App": app}
                pools.arrived(r.key, headers)
        pools.tick(float(second))
    d = pools.describe(r.key)
    assert {tuple(g["apps"]): g["kind"] for g in d["instances"]} == {("search",): "cpu", ("feed", "reports"): "gpu"}
    specs = {s.id: s.env for s in pools.runtime.plans[r.key]}
    cpu = next(env for pid, env in specs.items() if "-cpu-" in pid)
    gpu = next(env for pid, env in specs.items() if "-gpu-" in pid)
    assert cpu["FAAS_GPU_SCHEDULER_URL"] == ""  # the CPU group runs the model in its instances
    assert "FAAS_GPU_SCHEDULER_URL" not in gpu and int(gpu["FAAS_GPU_MAX_BATCH"]) > 1
    assert set(dict(kv.split("=") for kv in gpu["FAAS_GPU_APP_TIMEOUTS_MS"].split(","))) == {"feed", "reports"}
    ready = [(s.id, f"http://{s.id}") for s in pools.runtime.plans[r.key]]
    assert "-gpu-" in pools.pick(r.key, ready, {"X-Faas-Gpu-App": "feed"})
    assert "-cpu-" in pools.pick(r.key, ready, {"X-Faas-Gpu-App": "search"})


def test_an_unchanged_plan_is_not_applied_again(pools):
    r = record()
    pools.prepare(r, now=0.0)
    first = pools.runtime.plans[r.key]
    pools.tick(5.0)
    assert pools.runtime.plans[r.key] is first
