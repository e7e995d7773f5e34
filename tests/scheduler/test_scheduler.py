"""The scheduler daemon over real GPU Manager daemons (cpu back end), real HTTP, real etcd.

Covers placement through the LALB-O3 policy object, cache hits, a manager killed under load, and
the leader dying under load: every accepted job is answered. Last, the leader loop keeps the
scheduler's clock, not the machine's.
"""

from __future__ import annotations

import threading
import time

import requests
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from scheduler.core import Scheduler
from tests.classify_model import scripted_resnet
from tests.daemon_process import wait_units


def _run(urls, auth, digest, x, results, errors):
    """A client: retries on another scheduler when one dies or is not the leader."""
    for _ in range(100):
        for url in urls:
            try:
                r = requests.post(f"{url}/v1/jobs/{digest}", data=encode(x), headers=auth, timeout=60)
            except requests.ConnectionError:
                continue
            if r.status_code == 503:
                continue
            if r.status_code == 200:
                results.append(decode(r.content))
            else:
                errors.append((r.status_code, r.text))
            return
        time.sleep(0.2)
    errors.append(("gave up", ""))


def test_jobs_are_placed_by_lalb_and_hit_the_cache(cluster):
    start, auth = cluster
    start("gpu_manager", "--node", "n1", "--units", "2", "--unit-memory-mb", "2")
    sched = start("scheduler")
    wait_units(sched.url, auth, 2)
    data, model = scripted_resnet(1)
    digest = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
    x = torch.randn(3, 3, 32, 32)
    r1 = requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(x), headers=auth, timeout=60)
    assert r1.status_code == 200, r1.text
    assert torch.allclose(decode(r1.content), model(x), atol=1e-5)
    assert r1.headers["X-Faas-Gpu-Cache"] == "miss" and r1.headers["X-Faas-Gpu-Unit"].startswith("cpu-")
    r2 = requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(x), headers=auth, timeout=60)
    assert r2.headers["X-Faas-Gpu-Cache"] == "hit" and r2.headers["X-Faas-Gpu-Unit"] == r1.headers["X-Faas-Gpu-Unit"]
    bad = requests.post(
        f"{sched.url}/v1/jobs/{digest}", data=encode(torch.randn(1, 4, 32, 32)), headers=auth, timeout=60
    )
    assert bad.status_code == 400 and bad.text.startswith("model:")
    assert requests.post(f"{sched.url}/v1/jobs/{'b' * 64}", data=encode(x), headers=auth, timeout=10).status_code == 404
    assert requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(x), timeout=10).status_code == 401


def test_a_manager_killed_under_load_loses_no_job(cluster):
    start, auth = cluster
    m1 = start("gpu_manager", "--node", "n1", "--units", "1", "--unit-memory-mb", "4")
    start("gpu_manager", "--node", "n2", "--units", "1", "--unit-memory-mb", "4")
    sched = start("scheduler")
    wait_units(sched.url, auth, 2)
    data, _ = scripted_resnet(2)
    digest = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
    results, errors = [], []
    clients = [
        threading.Thread(target=_run, args=([sched.url], auth, digest, torch.randn(8, 3, 32, 32), results, errors))
        for _ in range(24)
    ]
    for c in clients:
        c.start()
    time.sleep(0.3)
    m1.kill()
    for c in clients:
        c.join(120)
    assert errors == [] and len(results) == 24


def test_leader_killed_under_load_hands_over_and_answers_every_job(cluster):
    start, auth = cluster
    start("gpu_manager", "--node", "n1", "--units", "2", "--unit-memory-mb", "4")
    s1 = start("scheduler")
    s2 = start("scheduler")
    urls = [s1.url, s2.url]
    leader = next(s for s in (s1, s2) if requests.get(f"{s.url}/v1/status", headers=auth, timeout=5).json()["leader"])
    follower = s2 if leader is s1 else s1
    data, _ = scripted_resnet(3)
    for s in (s1, s2):  # each replica keeps its own copy of the artifacts
        requests.put(f"{s.url}/v1/models", data=data, headers=auth, timeout=30).raise_for_status()
    digest = requests.put(f"{leader.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
    assert (
        requests.post(
            f"{follower.url}/v1/jobs/{digest}", data=encode(torch.randn(1, 3, 32, 32)), headers=auth, timeout=10
        ).status_code
        == 503
    )
    results, errors = [], []
    clients = [
        threading.Thread(target=_run, args=(urls, auth, digest, torch.randn(4, 3, 32, 32), results, errors))
        for _ in range(16)
    ]
    for c in clients:
        c.start()
    time.sleep(0.2)
    leader.kill()
    for c in clients:
        c.join(120)
    assert errors == [] and len(results) == 16
    assert wait_units(follower.url, auth, 2)["leader"]


def test_no_gpu_manager_means_503_after_a_bounded_wait(cluster):
    start, auth = cluster
    sched = start("scheduler", "--no-units-timeout", "1")
    data, _ = scripted_resnet(4)
    digest = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
    t0 = time.monotonic()
    r = requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(torch.randn(1, 3, 32, 32)), headers=auth, timeout=60)
    assert r.status_code == 503 and "no GPU unit" in r.text and time.monotonic() - t0 < 30


def test_model_larger_than_every_unit_is_507(cluster):
    start, auth = cluster
    start("gpu_manager", "--node", "n1", "--units", "1", "--unit-memory-mb", "0.5")
    sched = start("scheduler")
    wait_units(sched.url, auth, 1)
    data, _ = scripted_resnet(5)
    digest = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
    r = requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(torch.randn(1, 3, 32, 32)), headers=auth, timeout=60)
    assert r.status_code == 507 and "MB exceeds every unit (0.5 MB)" in r.text


def test_the_leader_loop_keeps_the_injected_clock(tmp_path):
    """The loop rereads the unit reports once a second of the scheduler's clock: while a test's
    clock stands still they are read once, however long the loop runs, and again once it moves."""
    ds = open_datastore(None, tmp_path / "state.db")
    reads: list[str] = []
    get_prefix = ds.get_prefix

    def counting(prefix, *args, **kwargs):
        if prefix == "/faas-gpu/units/":
            reads.append(prefix)
        return get_prefix(prefix, *args, **kwargs)

    ds.get_prefix = counting
    now = [0.0]
    sched = Scheduler(ds, ModelStore(tmp_path / "models"), "t", clock=lambda: now[0])
    sched.start()
    try:
        deadline = time.monotonic() + 10
        while not reads:
            assert time.monotonic() < deadline, "the loop never read the units"
            time.sleep(0.02)
        time.sleep(1.6)  # three idle rounds of the machine's time; the scheduler's clock stood still
        assert len(reads) == 1
        now[0] = 1.5  # past a second of the scheduler's clock
        deadline = time.monotonic() + 10
        while len(reads) < 2:
            assert time.monotonic() < deadline, "the loop did not follow its clock"
            time.sleep(0.02)
        time.sleep(1.2)
        assert len(reads) == 2
    finally:
        sched.close()
        ds.close()
