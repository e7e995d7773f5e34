"""The scheduler daemon over real GPU Manager daemons (cpu back end), real HTTP, real etcd.

Covers placement through the LALB-O3 policy object, cache hits, a manager killed under load, and
the leader dying under load: every accepted job is answered. Last, the leader loop keeps the
scheduler's clock, not the machine's.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.credentials import ensure_token
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
    up = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()
    digest, kept = up["digest"], up["size"]  # TorchScript is kept as its canonical (stored) archive
    x = torch.randn(3, 3, 32, 32)
    r1 = requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(x), headers=auth, timeout=60)
    assert r1.status_code == 200, r1.text
    assert torch.allclose(decode(r1.content), model(x), atol=1e-5)
    assert r1.headers["X-Faas-Gpu-Cache"] == "miss" and r1.headers["X-Faas-Gpu-Unit"].startswith("cpu-")
    r2 = requests.post(f"{sched.url}/v1/jobs/{digest}", data=encode(x), headers=auth, timeout=60)
    assert r2.headers["X-Faas-Gpu-Cache"] == "hit" and r2.headers["X-Faas-Gpu-Unit"] == r1.headers["X-Faas-Gpu-Unit"]
    # the cold start as /v1/status tells it (the CLI's progress line reads it): loaded where the miss ran
    status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=10).json()
    (state,) = [m for m in status["models"] if m["digest"] == digest]
    assert state["state"] == "loaded" and state["unit"] == f"n1/{r1.headers['X-Faas-Gpu-Unit']}"
    assert state["size"] == kept and state["load_s"] == round(float(r1.headers["X-Faas-Gpu-Load-Seconds"]), 3)
    assert state["function"] == "cluster" and status["uploading"] == []
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


def _scrape(url: str, auth: dict) -> tuple[dict[tuple[str, frozenset], float], str]:
    """A daemon's /metrics as {(sample name, labels): value}, parsed as Prometheus parses it, and its text."""
    from prometheus_client.parser import text_string_to_metric_families

    r = requests.get(f"{url}/metrics", headers=auth, timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r.text
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    return samples, r.text


def _labels(**kw: str) -> frozenset:
    return frozenset(kw.items())


def test_metrics_count_jobs_batches_slo_queues_and_the_cache(cluster, etcd_server, tmp_path):
    from faas_gpu.fn_credentials import FunctionCredentials

    start, auth = cluster
    manager = start("gpu_manager", "--node", "n1", "--units", "2", "--unit-memory-mb", "2")
    sched = start("scheduler")
    wait_units(sched.url, auth, 2)
    ds = open_datastore(etcd_server.url, cluster_token=ensure_token(tmp_path / "secrets"))  # as the provider
    creds = FunctionCredentials(ds, tmp_path / "function-tokens")
    fn = {"Authorization": f"Bearer {creds.issue('openfaas-fn', 'classify')}"}
    try:
        for url in (sched.url, manager.url):  # the cluster token only: the labels name every function
            assert requests.get(f"{url}/metrics", timeout=5).status_code == 401
            assert requests.get(f"{url}/metrics", headers=fn, timeout=5).status_code == 401
        data, _ = scripted_resnet(2)
        up = requests.put(f"{sched.url}/v1/models", data=data, headers=fn, timeout=30)
        assert up.status_code == 201, up.text
        digest = up.json()["digest"]
        strict = {**fn, "X-Faas-Gpu-Model": "resnet-mini", "X-Faas-Gpu-App": "fast"}
        for rows in (3, 3, 1):
            r = requests.post(
                f"{sched.url}/v1/jobs/{digest}",
                data=encode(torch.randn(rows, 3, 32, 32)),
                headers={**strict, "X-Faas-Gpu-Deadline-Ms": "60000"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
        late = requests.post(  # no budget left: a miss at once, never run
            f"{sched.url}/v1/jobs/{digest}",
            data=encode(torch.randn(1, 3, 32, 32)),
            headers={**strict, "X-Faas-Gpu-Deadline-Ms": "0"},
            timeout=60,
        )
        assert late.status_code == 504
        be = requests.post(
            f"{sched.url}/v1/jobs/{digest}",
            data=encode(torch.randn(2, 3, 32, 32)),
            headers={**fn, "X-Faas-Gpu-Class": "best-effort"},
            timeout=60,
        )
        assert be.status_code == 200, be.text

        got, text = _scrape(sched.url, auth)
        function = "classify.openfaas-fn"
        assert got[("faas_gpu_batch_size_count", _labels(function=function))] == 5  # one per job
        assert got[("faas_gpu_batch_size_sum", _labels(function=function))] == 3 + 3 + 1 + 1 + 2
        assert got[("faas_gpu_batch_size_bucket", _labels(function=function, le="1.0"))] == 2  # the two 1-row jobs
        slo = {
            s: got.get(("faas_gpu_slo_jobs_total", _labels(function=function, app="fast", slo=s)))
            for s in ("within", "over")
        }
        assert slo == {"within": 3, "over": 1}  # the best-effort job has no SLO
        model = _labels(model="resnet-mini", version=digest[:12])  # Triton's labels
        assert got[("nv_inference_request_success", model)] == 4
        assert got[("nv_inference_request_failure", model)] == 1
        assert got[("nv_inference_count", model)] == 3 + 3 + 1 + 2
        assert got[("nv_inference_exec_count", model)] == 4
        assert got[("nv_inference_compute_infer_duration_us", model)] > 0
        assert got[("nv_inference_queue_duration_us", model)] > 0
        assert got[("faas_gpu_queue_depth", _labels(**{"class": "strict"}))] == 0
        assert got[("faas_gpu_queue_depth", _labels(**{"class": "best-effort"}))] == 0
        placed = {k[1]: v for k, v in got.items() if k[0] == "faas_gpu_placement_decisions_total"}
        assert sum(placed.values()) == 4 and placed[_labels(policy="lalb_o3", cache="miss")] == 1
        assert got[("faas_gpu_placement_duration_seconds_count", _labels(policy="lalb_o3"))] >= 1
        assert got[("faas_gpu_scheduler_leader", frozenset())] == 1
        assert "# TYPE nv_inference_count untyped" in text  # Triton's exact name, no _total

        got, _ = _scrape(manager.url, auth)
        units = ("cpu-0", "cpu-1")
        count = lambda name: sum(got.get((name, _labels(unit=u)), 0) for u in units)  # noqa: E731
        assert count("faas_gpu_model_cache_misses_total") == 1  # one load, then hits on the same unit
        assert count("faas_gpu_model_cache_hits_total") == 3
        assert count("faas_gpu_model_loads_total") == 1 and count("faas_gpu_model_load_seconds_count") == 1
        assert count("faas_gpu_models_cached") == 1
        for u in units:
            assert got[("nv_gpu_memory_total_bytes", _labels(gpu_uuid=u))] == 2 * 1024**2  # the emulated budget
            assert 0.0 <= got[("nv_gpu_utilization", _labels(gpu_uuid=u))] <= 1.0
        used = sum(got[("nv_gpu_memory_used_bytes", _labels(gpu_uuid=u))] for u in units)
        assert used == pytest.approx(up.json()["size"], rel=1e-6)  # the one cached model's artifact, as kept
    finally:
        creds.revoke("openfaas-fn", "classify")
        ds.close()
