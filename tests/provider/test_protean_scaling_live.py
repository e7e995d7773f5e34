"""PROTEAN's autoscaling (§4.2) as the provider autoscaler's third policy: one container per batch
of requests in flight, delayed termination after a surplus window, bounds, and which policy
governs a function (`com.faas-gpu.scaling`).

The first tests drive the real `Autoscaler` tick by tick under fake time, over a real embedded
datastore and history (as tests/provider/test_autoscaler.py does); the last ones run a real stack process
with a 2 s surplus window and real replicas, and read the replicas from the provider's API.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from faas_gpu.datastore.embedded import EmbeddedDatastore
from faas_gpu.history import EmbeddedHistory
from provider.scaling import InflessScaling, ProteanFunctions, ScalingRouter, scaling_of
from provider.types import FunctionDeployment, FunctionRecord, ValidationError
from tests.provider.scaling_fakes import TABLE, Clock, TablePredictor
from tests.stack_process import StackProcess

WINDOW_S = 2.0


class Runtime:
    """Records what the autoscaler asks of a runtime: plans, applied replica counts."""

    def __init__(self):
        self.plans, self.applied = {}, {}

    def set_plan(self, namespace, name, plan):
        self.plans[(namespace, name)] = plan

    def apply(self, record):
        self.applied[record.key] = record.replicas

    def instances(self, namespace, name):
        return [f"{name}-{i}" for i in range(self.applied.get((namespace, name), 0))]


@pytest.fixture
def scaler(tmp_path):
    ds = EmbeddedDatastore(tmp_path / "state.db")
    history = EmbeddedHistory(tmp_path / "history.db")
    records: dict[tuple[str, str], FunctionRecord] = {}

    def set_replicas(ns, name, n):
        record = records.get((ns, name))
        if record is not None:
            record.replicas = n
        return record

    runtime, clock = Runtime(), Clock()
    policies = [
        InflessScaling(ds, history, TablePredictor({"cnn": TABLE}), cpus=8),
        ProteanFunctions(surplus_window_s=WINDOW_S),
    ]
    a = ScalingRouter(runtime, policies, set_replicas=set_replicas, clock=clock)
    a.records, a.fake_clock, a.ds = records, clock, ds
    yield a
    history.close()
    ds.close()


def record(annotations, labels=None, env=None, replicas=1, name="fn"):
    dep = FunctionDeployment.from_json(
        {"service": name, "image": "img", "annotations": annotations, "labels": labels or {}, "envVars": env or {}}
    )
    return FunctionRecord(dep, "openfaas-fn", replicas)


def deploy(scaler, r):
    scaler.validate(r)
    scaler.records[r.key] = r
    scaler.prepare(r)
    return r


def tick(scaler, seconds=1.0):
    scaler.fake_clock.t += seconds
    scaler.tick()


def replicas(scaler, r) -> int:
    return scaler.describe(r.key)["replicas"]


PROTEAN = {"com.faas-gpu.scaling": "protean", "com.faas-gpu.max-batch": "4"}


def test_one_replica_per_batch_of_requests_in_flight(scaler):
    r = deploy(scaler, record(PROTEAN, {"com.openfaas.scale.max": "10"}))
    assert scaler.manages(r.key) and scaler.describe(r.key)["policy"] == "protean"
    assert scaler.runtime.plans[r.key] is None  # identical replicas, no per-instance plan
    for _ in range(10):
        scaler.arrived(r.key)
    tick(scaler)
    assert replicas(scaler, r) == 3  # ceil(10 / 4)
    assert scaler.runtime.applied[r.key] == 3 and scaler.records[r.key].replicas == 3
    for _ in range(7):
        scaler.arrived(r.key)
    tick(scaler)
    assert replicas(scaler, r) == 5  # ceil(17 / 4)


def test_a_burst_that_ended_within_a_tick_still_counts(scaler):
    r = deploy(scaler, record(PROTEAN, {"com.openfaas.scale.max": "10"}))
    for _ in range(8):
        scaler.arrived(r.key)
    for _ in range(8):
        scaler.departed(r.key)
    tick(scaler)
    assert replicas(scaler, r) == 2


def test_surplus_replicas_stay_for_the_window_then_go(scaler):
    r = deploy(scaler, record(PROTEAN, {"com.openfaas.scale.max": "10"}))
    for _ in range(12):
        scaler.arrived(r.key)
    tick(scaler)
    assert replicas(scaler, r) == 3
    for _ in range(12):
        scaler.departed(r.key)
    seen = []
    for _ in range(4):  # the first tick still sees the burst; then quiet, but not for a whole window
        tick(scaler, 0.5)
        seen.append(replicas(scaler, r))
    assert seen == [3, 3, 3, 3]
    tick(scaler, WINDOW_S)
    assert replicas(scaler, r) == 1  # com.openfaas.scale.min (OpenFaaS's default 1)
    assert scaler.runtime.applied[r.key] == 1


def test_a_protean_function_with_openfaas_scale_zero_idles_to_zero_and_a_call_wakes_it(scaler):
    """Issue 46: OpenFaaS Pro's labels work for PROTEAN's functions too (its own keep-alive is
    delayed termination; `com.faas-gpu.scale-zero` stays refused for it)."""
    zero = {"com.openfaas.scale.zero": "true", "com.openfaas.scale.zero-duration": "30s"}
    r = deploy(scaler, record(PROTEAN, zero))
    seen = []
    for _ in range(40):
        tick(scaler)
        seen.append(replicas(scaler, r))
    assert seen[:28] == [1] * 28 and seen[-1] == 0
    scaler.arrived(r.key)  # a call at zero: it waits for the replica it starts
    assert scaler.scale_from_zero(r.key) and replicas(scaler, r) == 1
    for _ in range(60):
        tick(scaler)
        assert replicas(scaler, r) == 1
    scaler.departed(r.key, 200)


def test_load_back_within_the_window_keeps_the_replicas(scaler):
    r = deploy(scaler, record(PROTEAN, {"com.openfaas.scale.max": "10"}))
    for _ in range(12):
        scaler.arrived(r.key)
    tick(scaler)
    for _ in range(12):
        scaler.departed(r.key)
    for _ in range(4):  # surplus for 1 s of the 2 s window
        tick(scaler, 0.5)
    for _ in range(12):  # the load comes back: the surplus did not last a whole window
        scaler.arrived(r.key)
    tick(scaler, 0.5)
    for _ in range(12):
        scaler.departed(r.key)
    for _ in range(5):  # surplus again, for 1.5 s: 3.5 s since it began the first time
        tick(scaler, 0.5)
    assert replicas(scaler, r) == 3
    tick(scaler, WINDOW_S)
    assert replicas(scaler, r) == 1


def test_bounds_hold(scaler):
    r = deploy(scaler, record(PROTEAN, {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "3"}))
    assert replicas(scaler, r) == 2 and r.replicas == 2
    for _ in range(100):
        scaler.arrived(r.key)
    tick(scaler)
    assert replicas(scaler, r) == 3
    for _ in range(100):
        scaler.departed(r.key)
    tick(scaler)
    tick(scaler, WINDOW_S)
    tick(scaler, WINDOW_S)
    assert replicas(scaler, r) == 2
    scaler.scale_to(r.key, 50)
    assert replicas(scaler, r) == 3


def test_the_batch_size_comes_from_env_before_the_annotation(scaler):
    r = deploy(scaler, record(PROTEAN, {"com.openfaas.scale.max": "20"}, env={"FAAS_GPU_MAX_BATCH": "2"}))
    assert scaler.describe(r.key)["batch"] == 2
    for _ in range(10):
        scaler.arrived(r.key)
    tick(scaler)
    assert replicas(scaler, r) == 5


def test_each_function_has_exactly_one_policy(scaler):
    infless = record({"com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"}, name="a")
    protean = record({**PROTEAN, "com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"}, name="b")
    plain = record({}, name="c")
    assert [scaling_of(r) for r in (infless, protean, plain)] == ["infless", "protean", None]
    for r in (infless, protean, plain):
        deploy(scaler, r)
    assert scaler.describe(infless.key)["policy"] == "infless"
    assert scaler.describe(protean.key)["policy"] == "protean"
    assert scaler.describe(plain.key) is None
    # switching a function from INFless to PROTEAN drops its INFless instances and plan
    switched = record({**PROTEAN, "com.faas-gpu.model": "cnn", "com.faas-gpu.slo-ms": "100"}, name="a")
    deploy(scaler, switched)
    assert scaler.describe(switched.key)["policy"] == "protean"
    assert scaler.runtime.plans[switched.key] is None
    assert scaler.ds.get("/faas-gpu/instances/openfaas-fn/a") is None


@pytest.mark.parametrize(
    ("annotations", "env", "field"),
    [
        ({"com.faas-gpu.scaling": "fastest"}, {}, "com.faas-gpu.scaling must be one of infless, harmonybatch, protean"),
        ({"com.faas-gpu.scaling": "protean"}, {}, "com.faas-gpu.max-batch"),
        ({**PROTEAN, "com.faas-gpu.max-batch": "many"}, {}, "com.faas-gpu.max-batch must be a whole batch size"),
        ({**PROTEAN, "com.faas-gpu.max-batch": "0"}, {}, "com.faas-gpu.max-batch must be a whole batch size from 1"),
        (PROTEAN, {"FAAS_GPU_MAX_BATCH": "x"}, "envVars.FAAS_GPU_MAX_BATCH"),
        ({**PROTEAN, "com.faas-gpu.keep-alive": "lsth"}, {}, "com.faas-gpu.keep-alive applies to INFless"),
        ({**PROTEAN, "com.faas-gpu.scale-zero": "true"}, {}, "com.faas-gpu.scale-zero"),
        ({**PROTEAN, "com.faas-gpu.apps": "a=100"}, {}, "one scaling policy"),
        ({"com.faas-gpu.scaling": "infless"}, {}, "infless needs com.faas-gpu.model"),
        ({"com.faas-gpu.scaling": "harmonybatch"}, {}, "harmonybatch needs com.faas-gpu.apps"),
    ],
)
def test_bad_scaling_annotations_name_the_field(scaler, annotations, env, field):
    with pytest.raises(ValidationError, match=field):
        scaler.validate(record(annotations, env=env))


# -- live: a real stack, real replicas ---------------------------------------------------------
SLOW = "sh -c 'sleep 2; cat'"  # each request holds its place in flight for a while


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = StackProcess(tmp_path_factory.mktemp("protean"), "--protean-surplus-window", f"{WINDOW_S:g}s").start()
    yield s
    s.stop()


def _deploy(stack, service, annotations, labels=None):
    body = {
        "service": service,
        "image": f"functions/{service}:latest",
        "envProcess": SLOW,
        "annotations": annotations,
        "labels": labels or {},
    }
    return requests.post(f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=10)


def _replicas(stack, service) -> int:
    return requests.get(f"{stack.url}/system/function/{service}", auth=stack.auth, timeout=5).json()["replicas"]


def _wait(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_live_unknown_scaling_annotation_is_refused_with_400(stack):
    r = _deploy(stack, "bad-scaling", {"com.faas-gpu.scaling": "magic"})
    assert r.status_code == 400
    assert "com.faas-gpu.scaling" in r.text and "magic" in r.text
    r = _deploy(stack, "no-batch", {"com.faas-gpu.scaling": "protean"})
    assert r.status_code == 400 and "com.faas-gpu.max-batch" in r.text


def test_live_scale_up_per_batch_then_down_after_the_surplus_window(stack):
    name = "protean-fn"
    assert _deploy(stack, name, PROTEAN, {"com.openfaas.scale.max": "5"}).status_code == 202
    stack.wait_ready(name)
    answers: list[int] = []

    def call(i: int) -> None:
        r = requests.post(f"{stack.url}/function/{name}", data=str(i), timeout=60)
        answers.append(r.status_code)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]  # 12 in flight, batch 4
    for t in threads:
        t.start()
    assert _wait(lambda: _replicas(stack, name) == 3), _replicas(stack, name)
    for t in threads:
        t.join()
    assert answers == [200] * 12
    d = requests.get(f"{stack.url}/system/function/{name}/instances", auth=stack.auth, timeout=5).json()
    assert d["managed"] and d["policy"] == "protean" and d["batch"] == 4
    assert _wait(lambda: _replicas(stack, name) == 1), _replicas(stack, name)  # after 2 s of surplus
    assert _wait(
        lambda: (
            len(
                requests.get(f"{stack.url}/system/function/{name}/instances", auth=stack.auth, timeout=5).json()[
                    "instances"
                ]
            )
            == 1
        )
    )
