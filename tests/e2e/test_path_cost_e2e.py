"""The predictor knows the path, live: `faas-gpu profile --path` measures the serving path through a
real stack (gateway, watchdog, handler + client, scheduler, GPU Manager, worker), INFless's plan
counts it, `describe` shows predicted against observed capacity, and batching engages under load.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.daemon_process import Daemon
from tests.e2e.classify_project import classify_stack, write_project
from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow

ANNOTATIONS = {
    "com.faas-gpu.model": "resnet-mini",
    "com.faas-gpu.model-source": "model.py:ResNetMini",
    "com.faas-gpu.input-shape": "3,32,32",
    "com.faas-gpu.slo-ms": "250",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("path-cost")
    home = root / ".faas-gpu"
    home.mkdir()
    spec = classify_stack("e2e/classify-path:latest", ANNOTATIONS)
    spec["functions"]["classify"]["labels"] = {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "2"}
    write_project(root, spec)
    manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "256", "--node", "local")
    scheduler = Daemon("scheduler", home)
    s = StackProcess(
        home, "--scheduler", scheduler.url, "--cpus", "2", "--autoscale-period", "0.5", "--threads", "300"
    ).start()
    s.root = root
    yield s
    s.stop()
    scheduler.kill()
    manager.kill()


def cli(stack, *args) -> str:
    env = {**os.environ, "FAAS_GPU_HOME": str(stack.home)}
    p = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", *args], cwd=stack.root, env=env, capture_output=True, timeout=600
    )
    out = p.stdout.decode() + p.stderr.decode()
    assert p.returncode == 0, out[-3000:]
    return out


def instances(stack) -> dict:
    r = requests.get(f"{stack.provider_url}/system/function/classify/instances", auth=stack.auth, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_path_is_measured_counted_and_batching_engages_under_load(stack):
    cli(stack, "build", "-f", "stack.yml")
    cli(stack, "profile", "-f", "stack.yml", "classify", "--threads", "1", "--repeat", "3", "--batches", "1,2,4,8,16")
    cli(stack, "deploy", "-f", "stack.yml", "--gateway", stack.url)
    stack.wait_ready("classify", timeout_s=180)
    blind = instances(stack)["capacity"]
    assert blind["pathCostMs"] is None

    out = cli(stack, "profile", "--path", "classify", "--gateway", stack.url, "--path-seconds", "3")
    assert "stored for node" in out
    requests.delete(f"{stack.url}/system/functions", json={"functionName": "classify"}, auth=stack.auth, timeout=30)
    time.sleep(1)
    cli(stack, "deploy", "-f", "stack.yml", "--gateway", stack.url)
    stack.wait_ready("classify", timeout_s=180)
    counted = instances(stack)["capacity"]
    assert counted["pathCostMs"] is not None
    assert counted["predictedRps"] < blind["predictedRps"]  # batch 1 no longer "takes" what the model alone could

    # 32 callers that wait for their answers: the queue asks for more than batch 1 serves
    batches: list[int] = []
    answers: collections.Counter = collections.Counter()  # what the callers got, for a failure's message
    done = threading.Event()

    def caller(i: int) -> None:
        s = requests.Session()
        while not done.is_set():
            r = s.post(f"{stack.url}/function/classify", json={"seed": i}, timeout=60)
            answers[r.status_code] += 1
            if r.status_code == 200:
                batches.append(int(r.headers.get("X-Faas-Gpu-Batch", "1")))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    planned: list[list[int]] = []
    deadline = time.monotonic() + 240
    try:
        # until batches formed in a replica's queue (the instance grows its batch within its SLO at
        # once) and the planner has planned batched instances for the load it observes
        while time.monotonic() < deadline and not (
            batches and max(batches) > 1 and any(max(p, default=0) > 1 for p in planned)
        ):
            planned.append([i["batch"] for i in instances(stack)["instances"]])
            time.sleep(1)
    finally:
        done.set()
        for t in threads:
            t.join()
    seen = {"answers": dict(answers), "planned (last 20 s)": planned[-20:], "instances": instances(stack)["instances"]}
    assert any(max(p, default=0) > 1 for p in planned), seen
    assert max(batches) > 1, seen  # batches really formed in the replicas' queues

    described = cli(stack, "describe", "classify", "--gateway", stack.url)
    assert "Capacity:" in described and "rps predicted" in described and "Path cost:" in described
