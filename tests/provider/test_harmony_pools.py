"""HarmonyBatch in the provider without processes: annotations, app headers, plans applied as pools.

The runtime records the pools it is given (tests/e2e/test_harmony_e2e.py runs the real one); the
coefficients are VGG-19's from HarmonyBatch's model.json (see that test).
"""

import json
import re

import pytest

from provider.scaling import BadApp, HarmonyPools, ScalingRouter
from provider.scaling.harmony import parse_apps
from provider.types import FunctionDeployment, FunctionRecord, ValidationError
from tests.harmony_models import VGG19
from tests.provider.scaling_fakes import Clock, PlanRecorder


@pytest.fixture
def pools(tmp_path):
    """The provider's router with HarmonyBatch as its one policy, under a fake clock."""
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"VGG19": VGG19}))
    harmony = HarmonyPools(path, gpu_path=True, plan_period_s=1)
    replicas = {}
    clock = Clock(0.0)
    router = ScalingRouter(
        PlanRecorder(), [harmony], set_replicas=lambda ns, n, k: replicas.__setitem__((ns, n), k), clock=clock
    )
    router.harmony, router.replicas, router.fake_clock = harmony, replicas, clock
    return router


def record(apps="search=500,feed=800,reports=1000", model="VGG19", labels=None, **extra):
    ann = {"com.faas-gpu.apps": apps, "com.faas-gpu.harmony-model": model, **extra}
    body = {"service": "fn", "image": "img", "annotations": ann, "labels": labels or {}}
    return FunctionRecord(FunctionDeployment.from_json(body), "ns", 1)


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
    none = HarmonyPools(tmp_path / "absent.json", gpu_path=False)
    with pytest.raises(ValidationError, match="--harmony-coefficients"):
        none.validate(record())
    with pytest.raises(ValidationError, match="harmony-strategy"):
        pools.validate(record(**{"com.faas-gpu.harmony-strategy": "greedy"}))


def test_requests_name_their_app_by_header_or_by_slo(pools):
    harmony = pools.harmony
    state = harmony.state_of(record())
    assert harmony.app_of(state, {"X-Faas-Gpu-App": "feed"}) == "feed"
    assert harmony.app_of(state, {"X-Faas-Gpu-Slo-Ms": "900"}) == "feed"  # the loosest SLO that still meets it
    assert harmony.app_of(state, {"X-Faas-Gpu-Slo-Ms": "5000"}) == "reports"
    assert harmony.app_of(state, {}) == "search"  # the first declared app
    with pytest.raises(BadApp, match="X-Faas-Gpu-App: 'nope'"):
        harmony.app_of(state, {"X-Faas-Gpu-App": "nope"})
    with pytest.raises(BadApp, match="X-Faas-Gpu-Slo-Ms: no app"):
        harmony.app_of(state, {"X-Faas-Gpu-Slo-Ms": "100"})
    with pytest.raises(BadApp, match="X-Faas-Gpu-Slo-Ms: must be"):
        harmony.app_of(state, {"X-Faas-Gpu-Slo-Ms": "soon"})


def test_observed_rates_give_the_table_i_plan_and_pools_with_per_app_timeouts(pools):
    r = record()
    pools.prepare(r)
    for second in range(1, 31):
        for app, rate in (("search", 5), ("feed", 10), ("reports", 20)):
            for _ in range(rate):
                headers = {"X-Faas-Gpu-App": app}
                pools.arrived(r.key, headers)
        pools.fake_clock.t = float(second)
        pools.tick()
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
    pools.prepare(r)
    first = pools.runtime.plans[r.key]
    pools.fake_clock.t = 5.0
    pools.tick()
    assert pools.runtime.plans[r.key] is first


def test_a_scale_request_sets_a_floor_of_instances_over_the_pools(pools):
    """POST /system/scale-function on a HarmonyBatch function: `replicas` instances serve (the
    extra ones copies of the busiest pools), never fewer than the plan's pools; the planner
    keeps choosing the groups. (It stored the count and applied nothing before.)"""
    runtime, replicas = pools.runtime, pools.replicas
    r = record(labels={"com.openfaas.scale.max": "6"})
    pools.prepare(r)
    groups = len(runtime.plans[r.key])
    assert replicas[r.key] == groups
    assert pools.scale_to(r.key, groups + 2)
    plan = runtime.plans[r.key]
    assert len(plan) == groups + 2 and replicas[r.key] == groups + 2
    assert len({s.id for s in plan}) == groups + 2
    batches = {str(g["batch"]) for g in pools.describe(r.key)["plan"]["groups"]}
    assert {s.env["FAAS_GPU_MAX_BATCH"] for s in plan} <= batches
    assert [i["id"] for i in pools.describe(r.key)["instances"]] == [s.id for s in plan]
    ready = [(s.id, f"http://{s.id}") for s in plan]
    copies = [s.id for s in plan if re.search(r"-r\d+$", s.id)]
    for app in ("search", "feed", "reports"):
        picked = {pools.pick(r.key, ready, {"X-Faas-Gpu-App": app}) for _ in range(200)}
        owner = [i["id"] for i in pools.describe(r.key)["instances"] if app in i["apps"]]
        assert picked == {f"http://{i}" for i in owner}  # the app's pool and its copies share its requests
    assert len(copies) == 2
    pools.fake_clock.t = 5.0
    pools.tick()  # a re-plan keeps the floor
    assert len(runtime.plans[r.key]) == groups + 2
    assert pools.scale_to(r.key, 1)  # below the plan: every group keeps its pool
    assert len(runtime.plans[r.key]) == groups and replicas[r.key] == groups


def test_a_function_that_drops_its_apps_goes_back_to_identical_replicas(pools):
    """Its pools stop (the plan is withdrawn), not left running beside plain replicas."""
    r = record()
    pools.prepare(r)
    assert pools.runtime.plans[r.key] and pools.manages(r.key)
    plain = FunctionRecord(FunctionDeployment.from_json({"service": "fn", "image": "img"}), "ns", 1)
    pools.prepare(plain)
    assert pools.runtime.plans[r.key] is None and not pools.manages(r.key)
    assert pools.describe(r.key) is None


def test_harmonybatch_refuses_scale_to_zero_naming_why(tmp_path):
    """A pool per group at all times: OpenFaaS's scale-zero label is refused with 400, not ignored."""
    import pytest

    from provider.scaling import HarmonyPools
    from provider.types import FunctionDeployment, FunctionRecord, ValidationError

    dep = FunctionDeployment.from_json(
        {
            "service": "fn",
            "image": "img",
            "labels": {"com.openfaas.scale.zero": "true"},
            "annotations": {"com.faas-gpu.apps": "a=200", "com.faas-gpu.model": "VGG-19"},
        }
    )
    with pytest.raises(ValidationError, match="labels: com.openfaas.scale.zero: HarmonyBatch keeps a pool"):
        HarmonyPools(tmp_path / "absent.json", gpu_path=False).validate(FunctionRecord(dep, "openfaas-fn", 1))
