"""Late and abandoned work is not run: a strict job past its deadline leaves the queues as an SLO
miss (504), a job whose caller has gone is dropped before it starts, and one whose caller left
while it ran is counted. Core-level on the live scheduler (manual clock), then end to end over
real daemons (scheduler + GPU Manager on the sim back end, real etcd, real HTTP)."""

from __future__ import annotations

import threading
import time

import requests
import torch

from faas_gpu.contract.wire import encode
from tests.classify_model import scripted_resnet
from tests.daemon_process import wait_units
from tests.fake_nvml import FakeGPU
from tests.scheduler.live_node import LiveNode


def _one_gpu(tmp_path) -> LiveNode:
    return LiveNode(tmp_path, [(FakeGPU.a100_40gb(mig=False), [])], False)


def test_strict_job_past_its_deadline_is_dropped_as_a_miss_and_best_effort_still_runs(tmp_path):
    node = _one_gpu(tmp_path)
    try:
        s = node.scheduler
        running = node.submit(None)  # deadline now + 10 s
        assert len(node.round()) == 1  # the only unit is busy with it
        late = node.submit(None)
        be = node.submit(None, best_effort=True)
        node.now = 11.0  # past `late`'s deadline while it waits
        assert node.round() == []  # the unit is still busy; nothing new placed
        assert late.done.is_set() and late.outcome.status == 504
        assert b"missed its deadline" in late.outcome.body and b"not run" in late.outcome.body
        assert late.outcome.headers["X-Faas-Gpu-Deadline-Missed"] == "true"
        assert s.deadline_misses == 1 and s.late_dropped == 1
        assert late.id not in s._jobs and s.queued() == 1  # only the best-effort job waits
        node.finish(running)
        with s._lock:
            decisions, _ = s._round()
        assert [d.request.id for d in decisions] == [be.id]  # best-effort has no deadline: it runs
    finally:
        node.close()


def test_a_spent_budget_is_a_miss_at_once_without_queueing(tmp_path):
    node = _one_gpu(tmp_path)
    try:
        job = node.scheduler.submit(node.digest, b"x", 0.0)  # the client's remaining budget is gone
        assert job.done.is_set() and job.outcome.status == 504
        assert node.scheduler.queued() == 0 and node.scheduler.deadline_misses == 1
    finally:
        node.close()


def test_abandoned_waiting_job_is_never_started_and_a_running_one_is_counted(tmp_path):
    node = _one_gpu(tmp_path)
    try:
        s = node.scheduler
        running = node.submit(None)
        assert len(node.round()) == 1
        waiting = node.submit(None)
        s.abandon(waiting)
        assert waiting.done.is_set() and waiting.id not in s._jobs
        assert s.abandoned_dropped == 1 and s.queued() == 0
        s.abandon(running)
        assert s.abandoned_running == 1 and not running.done.is_set()  # it runs on; its result is unread
        node.finish(running)
        assert node.round() == []  # the abandoned job is not placed once the unit is free
    finally:
        node.close()


def test_job_abandoned_after_placement_is_not_sent_to_its_unit(tmp_path):
    """The last check, as the dispatch thread is about to call the manager."""
    node = _one_gpu(tmp_path)
    try:
        s = node.scheduler
        job = node.submit(None)
        with s._lock:
            decisions, units = s._round()
        s.abandon(job)  # the caller leaves between placement and the call
        assert s.abandoned_running == 1
        s._execute(decisions[0], units[decisions[0].unit])
        assert s.abandoned_running == 0 and s.abandoned_dropped == 1  # never ran after all
        with s._lock:
            assert s._policy.units[decisions[0].unit].running is None  # the unit is idle again
    finally:
        node.close()


def _unit_models(manager_url: str, auth: dict) -> set[str]:
    units = requests.get(f"{manager_url}/v1/units", headers=auth, timeout=10).json()
    return {m for u in units for m in u["models"]}


def test_over_http_a_gone_caller_and_a_late_strict_job_never_reach_the_gpu(cluster, tmp_path):
    start, auth = cluster
    profile = tmp_path / "slow-profile.txt"
    profile.write_text("slow 8 50 1 4000\nslow 8 50 8 4000\n")  # every batch holds the unit 4 s
    manager = start("gpu_manager", "--node", "n1", "--backend", "sim", "--sim-profile", str(profile),
                    "--sim-load-s", "0.05", "--units", "1")  # fmt: skip
    sched = start("scheduler")
    wait_units(sched.url, auth, 1)
    digests = []
    for seed in (1, 2, 3):  # one model each: a job that ran leaves its model in the unit's cache
        data, _ = scripted_resnet(seed)
        digests.append(requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"])
    busy, gone, late = digests
    x = encode(torch.zeros(1, 4))
    first: list[requests.Response] = []
    holder = threading.Thread(
        target=lambda: first.append(requests.post(f"{sched.url}/v1/jobs/{busy}", data=x, headers=auth, timeout=60))
    )
    holder.start()
    deadline = time.monotonic() + 10
    while requests.get(f"{sched.url}/v1/status", headers=auth, timeout=5).json()["queued"] or not any(
        u["state"] == "busy" for u in requests.get(f"{manager.url}/v1/units", headers=auth, timeout=5).json()
    ):
        assert time.monotonic() < deadline, "the first job never started"
        time.sleep(0.05)

    try:  # a caller that times out while its job waits behind the busy unit
        requests.post(f"{sched.url}/v1/jobs/{gone}", data=x, headers=auth, timeout=0.5)
        raise AssertionError("the job should still be waiting")
    except requests.ReadTimeout:
        pass
    strict = {**auth, "X-Faas-Gpu-Class": "strict", "X-Faas-Gpu-Deadline-Ms": "300"}
    r = requests.post(f"{sched.url}/v1/jobs/{late}", data=x, headers=strict, timeout=60)
    assert r.status_code == 504 and "missed its deadline" in r.text
    assert r.headers["X-Faas-Gpu-Deadline-Missed"] == "true"
    assert holder.is_alive(), "the late job must be answered when its deadline passes, not after the unit frees"
    holder.join(60)
    assert first and first[0].status_code == 200

    deadline = time.monotonic() + 10
    status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=5).json()
    while status["abandoned_dropped"] < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=5).json()
    assert status["abandoned_dropped"] == 1 and status["late_dropped"] == 1
    assert status["deadline_misses"] >= 1 and status["queued"] == 0
    time.sleep(0.5)  # time for a wrongly started job to reach the unit
    cached = _unit_models(manager.url, auth)
    assert busy in cached and gone not in cached and late not in cached
