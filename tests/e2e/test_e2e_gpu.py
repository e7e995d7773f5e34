"""The GPU path end to end: the torch example runs through the scheduler and a GPU Manager.

Everything on the embedded datastore of one state folder, as `make up` runs it.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import requests

from tests.daemon_process import Daemon
from tests.e2e.classify_project import add_function, build_and_deploy, classify_stack, write_project
from tests.stack_process import StackProcess

RAW_HANDLER = """
import json

import torch

from faas_gpu import remote

from .model import ResNetMini

model = remote(ResNetMini().eval())


def handle(event, context):
    channels = json.loads(event.body or b"{}").get("channels", 3)
    return {"statusCode": 200, "body": {"shape": list(model(torch.zeros(1, channels, 32, 32)).shape)}}
"""


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-e2e")
    home = root / ".faas-gpu"
    home.mkdir()
    stack_file = classify_stack(
        "e2e/classify-gpu:latest", {"com.faas-gpu.slo-ms": "400", "com.faas-gpu.max-batch": "8"}
    )
    add_function(root, stack_file, "raw", RAW_HANDLER, "e2e/raw:latest")
    write_project(root, stack_file)
    traces = pytest.MonkeyPatch()  # every daemon and instance appends its spans here (`faas_gpu.tracing`)
    traces.setenv("FAAS_GPU_TRACES_FILE", str(root / "spans.jsonl"))
    manager = Daemon("gpu_manager", home, "--units", "2", "--unit-memory-mb", "64", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(home, "--scheduler", scheduler.url).start()
    build_and_deploy(root, home, stack.url)
    stack.wait_ready("classify", timeout_s=120)
    stack.wait_ready("raw", timeout_s=120)
    stack.traces = root / "spans.jsonl"
    yield stack
    stack.stop()
    scheduler.kill()
    manager.kill()
    traces.undo()


def test_classify_runs_on_a_unit_and_says_which(gpu_stack):
    url = f"{gpu_stack.url}/function/classify"
    first = requests.post(url, json={"seed": 0}, timeout=120)
    assert first.status_code == 200, first.text
    assert first.headers["X-Faas-Gpu-Unit"].startswith("cpu-")
    assert first.headers["X-Faas-Gpu-Cache"] in ("miss", "hit")
    second = requests.post(url, json={"seed": 0}, timeout=60)
    assert second.headers["X-Faas-Gpu-Cache"] == "hit"
    assert second.json() == first.json()
    # the same answer as the model run locally in the instance (test_examples pins it)
    assert first.json()["predictions"][0]["label"] == "bird"


def test_bad_input_still_gets_the_handlers_400(gpu_stack):
    r = requests.post(f"{gpu_stack.url}/function/classify", json={"inputs": [1, 2]}, timeout=60)
    assert r.status_code == 400 and r.text.startswith("inputs:")


def test_concurrent_requests_are_all_answered(gpu_stack):
    import concurrent.futures

    url = f"{gpu_stack.url}/function/classify"
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: requests.post(url, json={"seed": i}, timeout=120), range(16)))
    assert all(a.status_code == 200 for a in answers) and time.monotonic() - t0 < 120


def test_wrong_tensor_shape_through_a_function_is_400_with_the_models_message(gpu_stack):
    ok = requests.post(f"{gpu_stack.url}/function/raw", json={"channels": 3}, timeout=120)
    assert ok.status_code == 200 and ok.json() == {"shape": [1, 10]}
    assert ok.headers["X-Faas-Gpu-Unit"].startswith("cpu-")
    bad = requests.post(f"{gpu_stack.url}/function/raw", json={"channels": 5}, timeout=120)
    assert bad.status_code == 400 and "model:" in bad.text


HOPS = [  # one call's path through the scheduler, each span the parent of the next
    "gateway.invoke",
    "gateway.forward",
    "instance.handle",
    "instance.batch",
    "scheduler.request",
    "scheduler.job",
    "scheduler.dispatch",
    "gpu_manager.job",
    "gpu_manager.execute",
]
LEASED_HOPS = [  # the same call under a placement lease: the instance sends it to the GPU Manager
    "gateway.invoke",
    "gateway.forward",
    "instance.handle",
    "instance.batch",
    "gpu_manager.request",
    "gpu_manager.job",
    "gpu_manager.execute",
]


def test_one_classify_call_is_one_trace_across_every_hop(gpu_stack):
    """W3C traceparent from the caller through gateway, watchdog, handler, batch queue, scheduler
    and GPU Manager: every hop's span in the caller's trace, each the child of the one before."""
    trace_id = os.urandom(16).hex()
    caller = os.urandom(8).hex()
    r = requests.post(
        f"{gpu_stack.url}/function/classify",
        json={"seed": 3},
        headers={"traceparent": f"00-{trace_id}-{caller}-01"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 20
    while True:  # the gateway's span ends after the answer is sent
        spans = [json.loads(line) for line in gpu_stack.traces.read_text().splitlines() if line.strip()]
        mine = [s for s in spans if s["context"]["trace_id"] == "0x" + trace_id]
        if any(s["name"] == "gateway.invoke" for s in mine) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    by_name = {s["name"]: s for s in mine}
    leased = "scheduler.request" not in by_name  # the first call of a model goes through the scheduler
    hops = LEASED_HOPS if leased else HOPS
    assert set(hops) <= set(by_name), sorted(by_name)
    assert by_name["gateway.invoke"]["parent_id"] == "0x" + caller
    for parent, child in zip(hops, hops[1:], strict=False):
        assert by_name[child]["parent_id"] == by_name[parent]["context"]["span_id"], (parent, child)
    waits = [("instance.batch_wait", "instance.handle")] + ([] if leased else [("scheduler.queue", "scheduler.job")])
    for waiting, parent in waits:
        assert by_name[waiting]["parent_id"] == by_name[parent]["context"]["span_id"]
    services = {s["resource"]["attributes"]["service.name"] for s in mine}
    assert {"faas-gpu-gateway", "faas-gpu-gpu-manager"} | (set() if leased else {"faas-gpu-scheduler"}) <= services
