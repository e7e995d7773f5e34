"""PROTEAN's request classes live: under overload, strict requests overtake best-effort ones.

A real stack, scheduler and GPU Manager on the sim back end (one unit, 150 ms a job, from a
profile file in INFless's format), the classify example with batches of one. A burst of
best-effort requests fills the queue; strict requests sent just after it are served first.
"""

from __future__ import annotations

import signal
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.daemon_process import Daemon
from tests.e2e.classify_project import build_and_deploy, classify_stack, write_project
from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow
JOB_MS = 150


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("protean-e2e")
    home = root / ".faas-gpu"
    home.mkdir()
    profile = root / "slow-profile.txt"
    profile.write_text("".join(f"slow 8 50 {b} {JOB_MS}\n" for b in (1, 2, 4, 8, 16, 32, 64)))
    # an SLO no strict job here misses: this is about order (a strict job past its deadline is
    # dropped as a miss, tests/scheduler/test_scheduler_late_work.py)
    annotations = {"com.faas-gpu.slo-ms": "10000", "com.faas-gpu.max-batch": "1"}
    write_project(root, classify_stack("protean/classify:latest", annotations, {"handler_threads": "64"}))
    manager = Daemon(
        "gpu_manager", home, "--backend", "sim", "--sim-profile", str(profile), "--units", "1", "--node", "local"
    )
    scheduler = Daemon("scheduler", home, "--be-max-wait", "30")
    stack = StackProcess(home, "--scheduler", scheduler.url, "--threads", "128").start()
    build_and_deploy(root, home, stack.url)
    stack.wait_ready("classify", timeout_s=120)
    # the first call uploads the model and loads it on the unit
    assert requests.post(f"{stack.url}/function/classify", json={"seed": 0}, timeout=120).status_code == 200
    yield stack
    stack.stop()
    scheduler.kill(signal.SIGTERM)
    manager.kill(signal.SIGTERM)


def test_a_class_or_slo_header_that_does_not_parse_is_refused(overloaded):
    url = f"{overloaded.url}/function/classify"
    r = requests.post(url, json={"seed": 1}, headers={"X-Faas-Gpu-Class": "urgent"}, timeout=30)
    assert r.status_code == 400 and "X-Faas-Gpu-Class" in r.text
    r = requests.post(url, json={"seed": 1}, headers={"X-Faas-Gpu-Slo-Ms": "-3"}, timeout=30)
    assert r.status_code == 400 and "X-Faas-Gpu-Slo-Ms" in r.text


def test_strict_requests_overtake_best_effort_ones_under_overload(overloaded):
    url = f"{overloaded.url}/function/classify"

    def call(n: int, klass: str) -> tuple[str, float, int]:
        t0 = time.monotonic()
        r = requests.post(url, json={"seed": n}, headers={"X-Faas-Gpu-Class": klass}, timeout=120)
        return klass, time.monotonic() - t0, r.status_code if r.status_code == 200 else (r.status_code, r.text[:300])

    with ThreadPoolExecutor(max_workers=40) as pool:
        futures = [pool.submit(call, n, "best-effort") for n in range(24)]
        time.sleep(0.5)  # the best-effort burst is queued: 24 jobs of 150 ms on one unit
        futures += [pool.submit(call, 100 + n, "strict") for n in range(6)]
        results = [f.result() for f in futures]
    assert {code for _, _, code in results} == {200}, results
    strict = sorted(t for k, t, _ in results if k == "strict")
    best_effort = sorted(t for k, t, _ in results if k == "best-effort")
    # strict work, sent after the burst, waits behind at most the jobs already placed
    assert statistics.median(strict) < statistics.median(best_effort)
    assert max(strict) + 0.5 < max(best_effort)
