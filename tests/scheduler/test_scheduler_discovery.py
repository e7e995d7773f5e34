"""The gateway finds every scheduler: each scheduler replica announces its URL in the datastore,
and the replicas the provider starts get it beside the URLs the provider was given."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from faas_gpu.datastore import open_datastore
from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port
from faas_gpu.schedulers import Announcement, announced, merge
from tests.stack_process import StackProcess

GIVEN = "http://127.0.0.1:9"  # the one URL the gateway was started with


def test_announced_schedulers_come_and_go_with_their_lease(tmp_path):
    ds = open_datastore(None, tmp_path / "state.db")
    try:
        a = Announcement(ds, "h:1/x/abc", "http://10.0.0.1:8091", ttl_s=2)
        b = Announcement(ds, "h:2/x/def", "http://10.0.0.2:8091", ttl_s=2)
        a.step()
        b.step()
        assert announced(ds) == ["http://10.0.0.1:8091", "http://10.0.0.2:8091"]
        a.withdraw()
        assert announced(ds) == ["http://10.0.0.2:8091"]
        time.sleep(3.5)  # b stopped refreshing (a dead scheduler): its lease expires
        assert announced(ds) == []
    finally:
        ds.close()
    assert merge("http://a/, http://b", ["http://b", "http://c"]) == "http://a,http://b,http://c"


def test_replicas_get_every_announced_scheduler_beside_the_given_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    log = open(home / "scheduler.log", "wb")  # noqa: SIM115
    sched = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--home", str(home), "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        stack = StackProcess(home, "--scheduler", GIVEN).start()
        body = {"service": "env", "image": "x", "envProcess": "cat"}
        assert requests.post(f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=10).status_code == 202
        stack.wait_ready("env")
        (pid_file,) = (home / "run").glob("*/*/pid")  # the replica's launcher: its one child is the watchdog
        launcher = int(pid_file.read_text())
        (watchdog,) = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
        environ = Path(f"/proc/{watchdog}/environ").read_bytes().split(b"\0")
        assert f"FAAS_GPU_SCHEDULER_URL={GIVEN},http://127.0.0.1:{port}".encode() in environ
    finally:
        if stack is not None:
            stack.stop()
        os.killpg(sched.pid, signal.SIGTERM)
        sched.wait(30)
