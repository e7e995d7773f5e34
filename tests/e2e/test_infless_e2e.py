"""INFless live: a profiled function gets instances of different batch sizes as its load changes.

A real stack process, a real torch model profiled on this CPU by `faas-gpu profile`, real
replicas that batch in their own queues; the decisions are read from the provider's API
(`/system/function/<name>/instances`) and `faas-gpu describe`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml

from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow

# A deep MLP, ~25 ms at batch 1 here, so that a load well above one instance's r_up is within this
# machine's reach; at batch 1 it is bound by reading its weights, so batching pays (as for real models).
MODEL = """
import torch
from torch import nn

WIDTH, DEPTH, INPUT = 2048, 35, 256


def make() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(INPUT, WIDTH), nn.ReLU()]
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10)).eval()
"""

HANDLER = """
import json

import torch

from faas_gpu import remote

from .model import INPUT, make

model = remote(make())


def handle(event, context):
    try:
        seed = int(json.loads(event.body or b"{}").get("seed", 0))
    except (ValueError, AttributeError):
        return {"statusCode": 400, "body": "seed: must be an integer"}
    x = torch.randn(1, INPUT, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        y = model(x)
    return {"statusCode": 200, "body": {"class": int(y.argmax())}, "headers": {"Content-Type": "application/json"}}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("infless")
    (root / "mlp").mkdir()
    (root / "mlp" / "model.py").write_text(MODEL)
    (root / "mlp" / "handler.py").write_text(HANDLER)
    stack = {
        "version": 1.0,
        "provider": {"name": "openfaas", "gateway": "http://127.0.0.1:8080"},
        "functions": {
            "mlp": {
                "lang": "python3-gpu",
                "handler": "./mlp",
                "image": "infless/mlp:latest",
                "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "4"},
                "annotations": {
                    "com.faas-gpu.model": "mlp-35x2048",
                    "com.faas-gpu.model-source": "model.py:make",
                    "com.faas-gpu.input-shape": "256",
                    # a loose SLO: small residual loads can still fill a batch before its timeout
                    "com.faas-gpu.slo-ms": "2000",
                },
            }
        },
    }
    (root / "stack.yml").write_text(yaml.safe_dump(stack))
    return root


@pytest.fixture(scope="module")
def stack(project):
    s = StackProcess(
        project / ".faas-gpu",
        "--cpus",
        "4",
        "--autoscale-period",
        "0.5",
        "--threads",
        "300",
        "--max-inflight-per-function",
        "300",
    ).start()
    yield s
    s.stop()


def cli(project, stack, *args, check=True) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAAS_GPU_HOME": str(stack.home)}
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", *args], cwd=project, env=env, capture_output=True, timeout=600
    )
    if check:
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    return proc


def instances(stack) -> dict:
    r = requests.get(f"{stack.provider_url}/system/function/mlp/instances", auth=stack.auth, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def drive(stack, rps: float, seconds: float) -> list[requests.Response]:
    """Open-loop load: requests start at `rps` whatever the answers take, as users' requests do
    (a closed loop would never offer more than the instances already serve)."""
    out: list[requests.Response] = []
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=256))

    def one(n: int) -> None:
        out.append(session.post(f"{stack.url}/function/mlp", json={"seed": n}, timeout=120))

    with ThreadPoolExecutor(max_workers=256) as pool:
        start = time.monotonic()
        n = 0
        while (now := time.monotonic()) - start < seconds:
            due = start + n / rps
            if due > now:
                time.sleep(due - now)
            pool.submit(one, n)
            n += 1
    return out


def test_deploy_without_a_profile_is_served_on_a_conservative_plan(project, stack):
    """Issue 46: a deploy never waits for a profile (it was `400 ... no profile for model`)."""
    cli(project, stack, "build", "-f", "stack.yml")
    cli(project, stack, "deploy", "-f", "stack.yml", "--gateway", stack.url)
    stack.wait_ready("mlp", timeout_s=120)
    r = requests.post(f"{stack.url}/function/mlp", json={"seed": 1}, timeout=60)
    assert r.status_code == 200, r.text
    d = instances(stack)
    assert d["managed"] and not d["profiled"] and "faas-gpu profile" in d["profile"]
    described = cli(project, stack, "describe", "mlp", "--gateway", stack.url).stdout.decode()
    assert "not profiled yet" in described
    cli(project, stack, "remove", "mlp", "--gateway", stack.url)  # the tests below deploy it afresh


def test_an_slo_below_the_predicted_latency_is_refused_with_the_figure(project, stack):
    cli(project, stack, "profile", "-f", "stack.yml", "mlp", "--batches", "1,2,4,8,16", "--threads", "1")
    spec = yaml.safe_load((project / "stack.yml").read_text())
    spec["functions"]["mlp"]["annotations"]["com.faas-gpu.slo-ms"] = "0.5"
    (project / "tight.yml").write_text(yaml.safe_dump(spec))
    proc = cli(project, stack, "deploy", "-f", "tight.yml", "--gateway", stack.url, check=False)
    err = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode != 0 and "com.faas-gpu.slo-ms" in err and "smallest predicted latency" in err


def test_instances_of_two_batch_sizes_follow_a_changing_load(project, stack):
    cli(project, stack, "deploy", "-f", "stack.yml", "--gateway", stack.url)
    stack.wait_ready("mlp", timeout_s=120)
    quiet = instances(stack)
    assert quiet["managed"] and [i["batch"] for i in quiet["instances"]] == [1]

    seen: list[dict] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen.append(instances(stack))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        answers = drive(stack, rps=130, seconds=25)
    finally:
        watching.set()
        watcher.join()
    codes = Counter(r.status_code for r in answers)
    trace = [(d["rps"], d["rMax"], [i["batch"] for i in d["instances"]]) for d in seen]
    bad = [(r.text[:200], dict(r.headers)) for r in answers if r.status_code != 200][:3]
    assert codes[200] >= 0.9 * len(answers), (codes, trace, bad)
    busiest = max(seen, key=lambda d: len({i["batch"] for i in d["instances"]}))
    batches = {i["batch"] for i in busiest["instances"]}
    assert len(batches) >= 2, [(d["rps"], d["rMax"], [i["batch"] for i in d["instances"]]) for d in seen]
    assert len(busiest["instances"]) <= 4  # com.openfaas.scale.max
    assert any(int(r.headers.get("X-Faas-Gpu-Batch", "1")) > 1 for r in answers)  # batches really formed

    described = cli(project, stack, "describe", "mlp", "--gateway", stack.url).stdout.decode()
    assert "mlp-35x2048" in described and "R_UP" in described

    # the load goes away: surplus instances are released, down to com.openfaas.scale.min
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(instances(stack)["instances"]) > 1:
        drive(stack, rps=5, seconds=1)
    assert len(instances(stack)["instances"]) == 1
