"""Replica processes live and die as a group: kill -9 of a replica's watchdog takes its handler
with it (no `python` reparented to PID 1 still listening), and the runtime starts a new replica."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import requests

from faas_gpu.ports import free_port
from faas_gpu.procs import alive
from tests.stack_process import StackProcess

# an http-mode handler that listens on the watchdog's upstream port and stays up
LISTENER = (
    'python3 -c "import os, socket, time; s = socket.socket(); '
    "s.bind(('127.0.0.1', int(os.environ['upstream_url'].rsplit(':', 1)[1]))); s.listen(); time.sleep(600)\""
)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def replica_pids(home: Path) -> list[int]:
    """Each replica's launcher (`faas_gpu.sandbox`): its one child is the watchdog, PID 1 of the
    replica's PID namespace; killing either ends the replica."""
    return [int(p.read_text()) for p in (home / "run").glob("*/*/pid")]


def tree(pid: int) -> list[int]:
    out = [pid]
    for child in children(pid):
        out += tree(child)
    return out


def test_kill_9_of_a_watchdog_takes_its_handler_with_it(tmp_path):
    home = tmp_path / "home"
    s = StackProcess(home).start()
    try:
        body = {"service": "holder", "image": "x", "envProcess": LISTENER, "envVars": {"mode": "http"}}
        assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (replica_pids(home) and len(tree(replica_pids(home)[0])) == 3):
            time.sleep(0.1)
        (launcher,) = replica_pids(home)
        (watchdog,) = children(launcher)
        (handler,) = children(watchdog)
        # a child seen between its fork and the end of its exec reads an empty or the parent's
        # cmdline (a CI run caught b""): wait for the handler's own
        while time.monotonic() < deadline and b"socket" not in Path(f"/proc/{handler}/cmdline").read_bytes():
            time.sleep(0.05)
        assert b"socket" in Path(f"/proc/{handler}/cmdline").read_bytes()
        os.kill(watchdog, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(handler):
            time.sleep(0.05)
        assert not alive(handler), "the handler outlived its watchdog"
        # the supervisor replaces the replica; stopping the stack leaves no replica process
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not [p for p in replica_pids(home) if p != launcher]:
            time.sleep(0.1)
        (new_launcher,) = replica_pids(home)
        new_group = tree(new_launcher)
    finally:
        s.stop()
    for pid in new_group:
        assert not alive(pid)


def test_a_handler_whose_watchdog_dies_before_the_runtime_sees_it_is_gone(tmp_path):
    """The death signal alone, without the runtime: a watchdog run by hand, then kill -9."""
    import subprocess
    import sys

    from faas_gpu import paths

    port, upstream = free_port(), free_port()
    env = {
        **os.environ,
        "fprocess": LISTENER,
        "mode": "http",
        "port": str(port),
        "upstream_url": f"http://127.0.0.1:{upstream}",
        "bind_address": "127.0.0.1",
        "metrics_port": "0",
    }
    wd = subprocess.Popen(
        [sys.executable, str(paths.TEMPLATES_DIR / "python3-gpu" / "fwatchdog.py")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not children(wd.pid):
            time.sleep(0.05)
        (handler,) = children(wd.pid)
        wd.kill()
        wd.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(handler):
            time.sleep(0.05)
        assert not alive(handler)
    finally:
        try:
            os.killpg(wd.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_9_of_the_provider_leaves_no_replica_process(tmp_path):
    home = tmp_path / "home"
    s = StackProcess(home).start()
    try:
        body = {"service": "orphan", "image": "x", "envProcess": LISTENER, "envVars": {"mode": "http"}}
        assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202
        s.wait_ready("orphan")
        (launcher,) = replica_pids(home)
        group = tree(launcher)
        assert len(group) == 3  # the launcher, the watchdog, the handler
    finally:
        s.stop(signal.SIGKILL)  # the provider's own group: replicas run in sessions of their own
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in group):
        time.sleep(0.05)
    assert not any(alive(p) for p in group), "replica processes outlived the provider"


def test_a_call_to_a_replica_that_just_died_goes_to_the_one_started_in_its_place(tmp_path):
    """Connection refused means the call never reached the replica: the gateway sends it to the
    replacement instead of answering 504 "Timeout reaching service" (a refused connection is
    `ReplicaRefused`, never a timeout)."""
    home = tmp_path / "home"
    s = StackProcess(home).start()
    try:
        body = {"service": "cat", "image": "x", "envProcess": "cat"}
        assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = requests.post(f"{s.url}/function/cat", data=b"warm", timeout=30)
            if r.status_code == 200:
                break
            time.sleep(0.1)
        (watchdog,) = replica_pids(home)
        os.kill(watchdog, signal.SIGKILL)
        while alive(watchdog):
            time.sleep(0.01)
        r = requests.post(f"{s.url}/function/cat", data=b"after the kill", timeout=90)
        assert (r.status_code, r.content) == (200, b"after the kill"), r.text
        assert [p for p in replica_pids(home) if p != watchdog], "no replacement replica"
    finally:
        s.stop()


def _call_while_killing_the_replica(tmp_path, annotations: dict[str, str]) -> requests.Response:
    """A slow call in flight when its replica is killed with -9 (the connection drops before any
    byte of an answer): what the gateway answers."""
    home = tmp_path / "home"
    s = StackProcess(home).start()
    try:
        body = {"service": "slow", "image": "x", "envProcess": "sh -c 'sleep 1; cat'", "annotations": annotations}
        assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202
        s.wait_ready("slow")
        (watchdog,) = replica_pids(home)
        answers: list[requests.Response] = []
        call = threading.Thread(
            target=lambda: answers.append(requests.post(f"{s.url}/function/slow", data=b"once more", timeout=90))
        )
        call.start()
        time.sleep(0.4)  # the call is in the replica's sleep
        os.kill(watchdog, signal.SIGKILL)
        call.join(90)
        return answers[0]
    finally:
        s.stop()


def test_a_call_dropped_by_a_dying_replica_is_sent_once_more_to_the_one_in_its_place(tmp_path):
    r = _call_while_killing_the_replica(tmp_path, {})
    assert (r.status_code, r.content) == (200, b"once more"), r.text


def test_a_function_that_must_not_run_twice_gets_openfaas_502_instead(tmp_path):
    r = _call_while_killing_the_replica(tmp_path, {"com.faas-gpu.retry-on-reset": "false"})
    assert r.status_code == 502 and r.text.startswith("Can't reach service for: slow"), r.text
