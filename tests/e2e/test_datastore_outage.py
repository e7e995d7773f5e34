"""etcd going away degrades the stack, never 500s: invocations flow from the records the provider
already knows, the control plane answers a prompt 503 naming the datastore, and everything
resumes by itself when etcd returns (a real etcd of this test's own, a real stack process)."""

from __future__ import annotations

import time

import pytest
import requests

from tests.servers import EtcdServer
from tests.stack_process import StackProcess


def _deploy(s: StackProcess, name: str) -> requests.Response:
    body = {"service": name, "image": "x", "envProcess": "cat"}
    return requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=30)


@pytest.mark.timeout(180)
def test_etcd_outage_keeps_invocations_flowing_and_control_plane_answers_503(tmp_path):
    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    s = StackProcess(tmp_path / "home", "--etcd", etcd.url).start()
    try:
        assert _deploy(s, "through-outage").status_code == 202
        s.wait_ready("through-outage")
        etcd.stop()

        for i in range(5):  # the replicas still run: the gateway routes from the record it knows
            r = requests.post(f"{s.url}/function/through-outage", data=f"up {i}".encode(), timeout=30)
            assert r.status_code == 200, r.text
            assert r.content == f"up {i}".encode()

        for path in ("/system/functions", "/system/function/through-outage"):
            t0 = time.monotonic()
            r = requests.get(f"{s.url}{path}", auth=s.auth, timeout=30)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert "datastore" in r.text and "etcd" in r.text
            assert r.headers["Content-Type"].startswith("text/plain")  # ours, not gunicorn's HTML 500
            assert time.monotonic() - t0 < 10, "the 503 must be prompt (it took 30 s before)"
        r = _deploy(s, "during-outage")
        assert r.status_code == 503 and "datastore" in r.text

        r = requests.post(f"{s.url}/function/never-deployed", data=b"x", timeout=30)
        assert r.status_code == 503 and "datastore" in r.text  # unknown: cannot say 404 without the store
        r = requests.post(f"{s.url}/async-function/through-outage", data=b"q", timeout=30)
        assert r.status_code == 202  # accepted from the known record

        etcd.start()
        deadline = time.monotonic() + 30
        while requests.get(f"{s.url}/system/functions", auth=s.auth, timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "the control plane did not resume after etcd returned"
            time.sleep(0.2)
        assert _deploy(s, "after-outage").status_code == 202
        s.wait_ready("after-outage")
        assert requests.post(f"{s.url}/function/after-outage", data=b"back", timeout=30).content == b"back"
        r = requests.post(f"{s.url}/function/never-deployed", data=b"x", timeout=30)
        assert r.status_code == 404
    finally:
        s.stop()
        etcd.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_scheduler_and_manager_loops_resume_by_themselves_after_an_etcd_outage(tmp_path):
    """The manager's status reports (under a lease) and the scheduler's leader election and unit
    refresh all ride out etcd being away: jobs keep running on the units already known while it
    is away, and after it is back, nothing restarted."""
    import torch

    from faas_gpu.contract.wire import encode
    from faas_gpu.credentials import ensure_token
    from tests.classify_model import scripted_resnet
    from tests.daemon_process import Daemon, wait_units

    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    token = ensure_token(tmp_path / "secrets")
    auth = {"Authorization": f"Bearer {token}"}
    profile = tmp_path / "profile.txt"
    profile.write_text("m 8 50 1 20\nm 8 50 8 20\n")
    args = ("--etcd", etcd.url)
    manager = Daemon("gpu_manager", tmp_path, *args, "--backend", "sim", "--sim-profile", str(profile), "--units", "1")
    sched = Daemon("scheduler", tmp_path, *args)
    try:
        wait_units(sched.url, auth, 1)
        data, _ = scripted_resnet(1)
        digest = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
        x = encode(torch.zeros(1, 4))
        assert requests.post(f"{sched.url}/v1/jobs/{digest}", data=x, headers=auth, timeout=30).status_code == 200
        etcd.stop()
        time.sleep(5)  # past the leader's lease: nobody can be elected while etcd is away
        during = requests.post(f"{sched.url}/v1/jobs/{digest}", data=x, headers=auth, timeout=30)
        assert during.status_code == 200, during.text  # the leader keeps placing on the units it knows
        time.sleep(5)  # leases run out, gRPC backs off, loops fail round after round
        etcd.start()
        deadline = time.monotonic() + 30
        while True:
            r = requests.post(f"{sched.url}/v1/jobs/{digest}", data=x, headers=auth, timeout=30)
            if r.status_code == 200:
                break
            assert r.status_code == 503, r.text  # not the leader yet, or no unit yet: a clear retry
            assert time.monotonic() < deadline, "the scheduler did not resume after etcd returned"
            time.sleep(0.2)
        assert manager.proc.poll() is None and sched.proc.poll() is None
        deadline = time.monotonic() + 30
        while (st := wait_units(sched.url, auth, 1))["datastore"] != "ok" or st["leader_id"] is None:
            assert time.monotonic() < deadline, f"the scheduler did not see etcd again: {st}"
            time.sleep(0.2)
        assert st["leader"]
    finally:
        manager.kill()
        sched.kill()
        etcd.stop()


@pytest.mark.timeout(180)
def test_a_hung_etcd_holds_no_invocation_of_a_function_the_gateway_knows(tmp_path):
    """Issue 42: nothing in a call's path waits on etcd. A gateway that knows a function rereads
    its record once a second; with etcd hung (SIGSTOP: connections taken, nothing answered, as a
    partition looks) that read held the call that made it for etcd's deadline, once a second for
    as long as the outage lasted. It is made off the call's thread now."""
    import os
    import signal

    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    s = StackProcess(tmp_path / "home", "--etcd", etcd.url).start()
    try:
        assert _deploy(s, "known").status_code == 202
        s.wait_ready("known")
        os.kill(etcd.proc.pid, signal.SIGSTOP)
        try:
            slowest, n = 0.0, 0
            until = time.monotonic() + 6
            while time.monotonic() < until:
                t0 = time.monotonic()
                r = requests.post(f"{s.url}/function/known", data=f"up {n}".encode(), timeout=30)
                slowest = max(slowest, time.monotonic() - t0)
                assert r.status_code == 200 and r.content == f"up {n}".encode(), r.text
                n += 1
                time.sleep(0.05)
            assert slowest < 0.8, f"a call waited {slowest:.2f} s on the hung datastore"
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
    finally:
        s.stop()
        etcd.stop()
