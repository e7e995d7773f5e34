"""A scheduler restart is ridden out in seconds, not a lease's TTL (issue 42).

kill -9 of the scheduler's gunicorn worker: gunicorn forks a new one, which found the leader key
still held by its dead predecessor and waited out that lease before it placed anything, while
strict calls missed their SLO. The new process is the same replica (the same address, port and
host: only one process at a time serves the port), so it ends the dead one's lease and leads at
once. Real etcd, real daemons; the lease's TTL is set long here so that waiting it out cannot pass
for taking over.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import requests
import torch

from faas_gpu.contract import headers as h
from faas_gpu.contract.wire import encode
from tests.classify_model import scripted_resnet
from tests.daemon_process import wait_units

LEADER_TTL_S = 20


def _worker(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert children, f"the scheduler (pid {master}) has no gunicorn worker"
    return int(children[0])


def test_a_restarted_scheduler_process_takes_its_own_leadership_back_at_once(cluster, tmp_path):
    start, auth = cluster
    profile = tmp_path / "profile.txt"
    profile.write_text("m 8 50 1 5\nm 8 50 8 5\n")
    start("gpu_manager", "--backend", "sim", "--sim-profile", str(profile), "--units", "1")
    sched = start("scheduler", "--leader-ttl", str(LEADER_TTL_S))
    wait_units(sched.url, auth, 1)
    artifact, _ = scripted_resnet(1)
    digest = requests.put(f"{sched.url}/v1/models", data=artifact, headers=auth, timeout=30).json()["digest"]
    strict = {**auth, h.CLASS: "strict", h.BUDGET_MS: "5000"}
    x = encode(torch.zeros(1, 4))
    assert requests.post(f"{sched.url}/v1/jobs/{digest}", data=x, headers=strict, timeout=30).status_code == 200

    old = _worker(sched.proc.pid)
    before = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=5).json()["leader_id"]
    os.kill(old, signal.SIGKILL)
    t0 = time.monotonic()
    while True:
        try:
            st = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=5).json()
            if st["leader"] and st["leader_id"] != before:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() - t0 < LEADER_TTL_S / 2, "the new process waited out its predecessor's lease"
        time.sleep(0.1)
    assert _worker(sched.proc.pid) != old
    r = requests.post(f"{sched.url}/v1/jobs/{digest}", data=x, headers=strict, timeout=30)
    assert r.status_code == 200, r.text
