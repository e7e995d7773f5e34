"""HarmonyBatch live: three apps of one function; two are grouped onto one GPU pool, one stays on CPU.

A real stack with the scheduler and a GPU Manager (cpu back end); the latency/cost coefficients
are VGG-19's from HarmonyBatch's model.json (numbers from icloud-ecnu/HarmonyBatch, MIT), the
paper's Table I example: SLOs 0.5 / 0.8 / 1.0 s at 5 / 10 / 20 req/s. The plan and its predicted
cost are read from the provider's API; where each app's requests ran is read from the responses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml

from tests.daemon_process import Daemon
from tests.e2e.classify_project import classify_stack, write_project
from tests.harmony_models import VGG19
from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow

APPS = {"search": (500, 5.0), "feed": (800, 10.0), "reports": (1000, 20.0)}


def _stack_file(apps: dict[str, tuple[float, float]]) -> dict:
    annotations = {
        "com.faas-gpu.apps": ",".join(f"{n}={slo:g}" for n, (slo, _) in apps.items()),
        "com.faas-gpu.harmony-model": "VGG19",
    }
    return classify_stack("harmony/classify:latest", annotations)


@pytest.fixture(scope="module")
def harmony_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("harmony-e2e")
    home = root / ".faas-gpu"
    home.mkdir()
    (home / "harmony-models.json").write_text(json.dumps({"VGG19": VGG19}))
    write_project(root, _stack_file(APPS))
    manager = Daemon("gpu_manager", home, "--units", "2", "--unit-memory-mb", "64", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(
        home,
        "--scheduler",
        scheduler.url,
        "--harmony-plan-period",
        "2",
        "--threads",
        "160",
        "--max-inflight-per-function",
        "160",
    )
    stack.start()
    stack.root = root
    cli(stack, "build", "-f", "stack.yml")
    yield stack
    stack.stop()
    scheduler.kill(signal.SIGTERM)
    manager.kill(signal.SIGTERM)


def cli(stack, *args, check=True) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAAS_GPU_HOME": str(stack.home)}
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", *args], cwd=stack.root, env=env, capture_output=True, timeout=300
    )
    if check:
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    return proc


def plan_of(stack) -> dict:
    r = requests.get(f"{stack.provider_url}/system/function/classify/instances", auth=stack.auth, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_app_slo_no_configuration_meets_is_refused_with_the_best_latency(harmony_stack):
    (harmony_stack.root / "tight.yml").write_text(yaml.safe_dump(_stack_file({"instant": (1, 1.0)})))
    proc = cli(harmony_stack, "deploy", "-f", "tight.yml", "--gateway", harmony_stack.url, check=False)
    err = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode != 0 and "com.faas-gpu.apps" in err and "'instant'" in err and "best latency" in err


def test_two_apps_share_a_gpu_pool_while_the_third_stays_on_cpu(harmony_stack):
    s = harmony_stack
    cli(s, "build", "-f", "stack.yml")
    cli(s, "deploy", "-f", "stack.yml", "--gateway", s.url)
    s.wait_ready("classify", timeout_s=120)
    assert plan_of(s)["policy"] == "harmonybatch"

    bad = requests.post(f"{s.url}/function/classify", json={"seed": 1}, headers={"X-Faas-Gpu-App": "nope"})
    assert bad.status_code == 400 and "X-Faas-Gpu-App" in bad.text

    answers: dict[str, list[tuple[float, requests.Response]]] = {n: [] for n in APPS}
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=128))

    def one(app: str, n: int) -> None:
        sent = time.monotonic()
        r = session.post(f"{s.url}/function/classify", json={"seed": n}, headers={"X-Faas-Gpu-App": app}, timeout=60)
        answers[app].append((sent, r))

    start, seconds = time.monotonic(), 40.0
    arrivals = sorted((i / rate, app) for app, (_, rate) in APPS.items() for i in range(int(rate * seconds)))
    with ThreadPoolExecutor(max_workers=128) as pool:
        for n, (at, app) in enumerate(arrivals):
            time.sleep(max(0.0, start + at - time.monotonic()))
            pool.submit(one, app, n)
        d = plan_of(s)  # while the load still runs: once it stops, the rates (and the plan) fall
    groups = {tuple(sorted(g["apps"])): g["kind"] for g in d["instances"]}
    assert groups == {("search",): "cpu", ("feed", "reports"): "gpu"}, d["plan"]
    gpu = next(g for g in d["instances"] if g["kind"] == "gpu")
    assert gpu["batch"] > 1 and set(gpu["timeoutsMs"]) == {"feed", "reports"}
    assert gpu["timeoutsMs"]["feed"] < gpu["timeoutsMs"]["reports"]  # the tighter app waits less
    assert d["predictedCostPerRequest"] > 0 and d["plan"]["groups"]
    assert {a["name"]: a["rate"] > 0 for a in d["apps"]} == dict.fromkeys(APPS, True)

    late = start + seconds - 10  # once the plan has settled
    for app, rows in answers.items():
        recent = [r for t, r in rows if t >= late]
        failed = [(r.status_code, r.text[:200]) for r in recent if r.status_code != 200]
        assert recent and not failed, (app, failed[:3])
        via_gpu = {bool(r.headers.get("X-Faas-Gpu-Unit")) for r in recent}
        assert via_gpu == ({False} if app == "search" else {True}), app

    described = cli(s, "describe", "classify", "--gateway", s.url).stdout.decode()
    assert "harmonybatch" in described and "feed" in described
