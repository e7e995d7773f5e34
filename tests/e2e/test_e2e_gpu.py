"""The GPU path end to end: the torch example runs through the scheduler and a GPU Manager.

Everything on the embedded datastore of one state folder, as `make up` runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import requests

from faas_gpu.paths import REPO_ROOT
from tests.daemon_process import Daemon
from tests.e2e.classify_project import classify_stack, write_project
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
    raw = root / "raw"
    raw.mkdir()
    shutil.copy(REPO_ROOT / "functions" / "classify" / "model.py", raw / "model.py")
    (raw / "handler.py").write_text(RAW_HANDLER)
    stack_file["functions"]["raw"] = {"lang": "python3-gpu", "handler": "./raw", "image": "e2e/raw:latest"}
    write_project(root, stack_file)
    manager = Daemon("gpu_manager", home, "--units", "2", "--unit-memory-mb", "64", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(home, "--scheduler", scheduler.url).start()
    env = {**os.environ, "FAAS_GPU_HOME": str(home)}
    for cmd in (["build", "-f", "stack.yml"], ["deploy", "-f", "stack.yml", "--gateway", stack.url]):
        subprocess.run(
            [sys.executable, "-m", "faas_gpu.cli", *cmd],
            cwd=root,
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
    stack.wait_ready("classify", timeout_s=120)
    stack.wait_ready("raw", timeout_s=120)
    yield stack
    stack.stop()
    scheduler.kill()
    manager.kill()


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
