"""`faas-gpu up` / `down` with real daemons: every daemon is supervised and tracked.

Each test runs the real CLI against a state folder of its own on free ports, kills real
processes with SIGKILL, and checks /proc for what is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
import torch

from faas_gpu import procs
from faas_gpu.contract.wire import encode
from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402

from tests.torchscript import torchscript_bytes

MODULES = ("faas_gpu.supervise", "provider.server", "scheduler", "gpu_manager")


def _port_pair() -> int:
    """A free port whose successor is free too (two scheduler replicas)."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


class Up:
    def __init__(self, home: Path, *extra: str):
        self.home = home
        self.ports = {
            "gateway": free_port(),
            "provider": free_port(),
            "gpu-manager": free_port(),
            "scheduler": _port_pair(),
        }
        self.extra = extra

    def cli(self, *argv: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
        env = {**os.environ, "FAAS_GPU_HOME": str(self.home)}
        return subprocess.run(
            [sys.executable, "-m", "faas_gpu.cli", *argv],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def up(self) -> subprocess.CompletedProcess:
        p = self.ports
        r = self.cli(
            "up",
            "--no-deploy",
            "--gateway-port", str(p["gateway"]),
            "--provider-port", str(p["provider"]),
            "--gpu-manager-port", str(p["gpu-manager"]),
            "--scheduler-port", str(p["scheduler"]),
            "--backend", "cpu",
            *self.extra,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr + self.logs()
        return r

    def down(self) -> subprocess.CompletedProcess:
        return self.cli("down")

    def pid(self, name: str) -> int:
        return int((self.home / f"{name}.pid").read_text())

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def auth(self) -> tuple[str, str]:
        s = self.home / "secrets"
        return (s / "basic-auth-user").read_text().strip(), (s / "basic-auth-password").read_text().strip()

    def leftovers(self) -> list[int]:
        """Every process still running for this home: daemons, and replicas of its run dir."""
        found = [pid for m in MODULES for pid in procs.find(m, self.home)]
        for pid_file in (self.home / "run").glob("*/*/pid"):
            pid = int(pid_file.read_text())
            if procs.alive(pid):
                found.append(pid)
        return found

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.home.glob("*.log")))


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(what)


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _descendants(pid: int) -> list[int]:
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = []
        for task in Path(f"/proc/{p}/task").glob("*"):  # children of every thread, not the main one's
            try:
                kids += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        out += kids
        frontier += kids
    return out


def _deploy_cat(stack: Up, name: str) -> None:
    body = {"service": name, "image": "x", "envProcess": "cat"}
    r = requests.post(f"{stack.url('gateway')}/system/functions", json=body, auth=stack.auth(), timeout=10)
    assert r.status_code == 202, r.text
    _wait(
        lambda: requests.post(f"{stack.url('gateway')}/function/{name}", data=b"hi", timeout=10).content == b"hi",
        30,
        f"{name} never served",
    )


def test_a_killed_gpu_manager_is_restarted_and_its_workers_die_with_it(tmp_path):
    stack = Up(tmp_path / "home", "--schedulers", "2")
    try:
        stack.up()
        # the gateway got every scheduler, and so do the replicas it starts
        sched = [f"http://127.0.0.1:{stack.ports['scheduler'] + i}" for i in range(2)]
        argv = procs.cmdline(stack.pid("faas-gpu"))
        assert argv[argv.index("--scheduler") + 1] == ",".join(sched)
        _deploy_cat(stack, "env-check")
        (launcher,) = [int(p.read_text()) for p in (stack.home / "run").glob("*/*/pid")]
        watchdog = _descendants(launcher)[0]  # the launcher's one child, in the replica's sandbox
        environ = Path(f"/proc/{watchdog}/environ").read_bytes().split(b"\0")
        assert f"FAAS_GPU_SCHEDULER_URL={','.join(sched)}".encode() in environ
        assert all(_healthy(u) for u in sched)

        # a model worker on the manager
        manager = stack.url("gpu-manager")
        token = (stack.home / "secrets" / "gpu-manager-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        artifact = torchscript_bytes(ResNetMini().eval())
        digest = requests.put(f"{manager}/v1/models", data=artifact, headers=auth, timeout=30).json()["digest"]
        x = encode(torch.randn(1, 3, 32, 32))
        r = requests.post(f"{manager}/v1/jobs/{digest}?unit=cpu-0", data=x, headers=auth, timeout=120)
        assert r.status_code == 200, r.text
        old = stack.pid("gpu-manager")
        tree = _descendants(old)
        assert any(b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes() for p in tree), tree

        os.kill(old, signal.SIGKILL)
        _wait(lambda: not any(procs.alive(p) for p in tree), 15, "the manager's workers outlived it")
        _wait(lambda: stack.pid("gpu-manager") != old and _healthy(manager), 30, "the manager was not restarted")
        assert procs.runs(stack.pid("gpu-manager"), "gpu_manager", stack.home)
        r = requests.put(f"{manager}/v1/models", data=artifact, headers=auth, timeout=30)
        r = requests.post(f"{manager}/v1/jobs/{digest}?unit=cpu-0", data=x, headers=auth, timeout=120)
        assert r.status_code == 200, r.text
    finally:
        stack.down()
    assert stack.leftovers() == []


def test_up_recognises_a_busy_stack_and_down_stops_what_actually_runs(tmp_path):
    stack = Up(tmp_path / "home", "--no-gpu")
    try:
        stack.up()
        gateway = stack.pid("faas-gpu")
        group = [gateway, *_descendants(gateway)]
        for p in group:  # busy: its /healthz answers nothing for a while
            os.kill(p, signal.SIGSTOP)
        resume = threading.Timer(3.0, lambda: [os.kill(p, signal.SIGCONT) for p in group])
        resume.start()
        try:
            stack.up()
        finally:
            resume.join()
        assert stack.pid("faas-gpu") == gateway
        assert procs.find("provider.server", stack.home) == [gateway]
        _deploy_cat(stack, "cat")

        # the supervisor crashes and the gateway's pid file lies (a dead pid): a new `up` adopts
        # the running daemons (found by command line), starts no second one
        os.kill(stack.pid("supervisor"), signal.SIGKILL)
        (stack.home / "faas-gpu.pid").write_text("4194000")
        stack.up()
        assert stack.pid("faas-gpu") == gateway and procs.find("provider.server", stack.home) == [gateway]

        # then a pid file that lies (a dead pid): `down` still stops the real gateway
        os.kill(stack.pid("supervisor"), signal.SIGKILL)
        (stack.home / "faas-gpu.pid").write_text("4194000")
    finally:
        r = stack.down()
    assert r.returncode == 0, r.stderr
    _wait(lambda: stack.leftovers() == [], 10, f"left running after down: {stack.leftovers()}")
    assert not list(stack.home.glob("*.pid"))


def test_a_killed_gateway_is_restarted_by_the_supervisor(tmp_path):
    stack = Up(tmp_path / "home", "--no-gpu")
    try:
        stack.up()
        _deploy_cat(stack, "cat")
        old = stack.pid("faas-gpu")
        os.kill(old, signal.SIGKILL)
        _wait(lambda: stack.pid("faas-gpu") != old and _healthy(stack.url("gateway")), 30, "gateway not restarted")
        _wait(
            lambda: requests.post(f"{stack.url('gateway')}/function/cat", data=b"x", timeout=10).content == b"x",
            30,
            "the function did not come back with the gateway",
        )
    finally:
        stack.down()
    assert stack.leftovers() == []


def test_up_moves_the_datastore_logins_into_secrets_and_no_daemon_command_line_holds_them(
    tmp_path, etcd_server, redis_server
):
    """`up --etcd http://user:pass@... --redis redis://user:pass@...`: the logins land in the
    state folder's secrets/ (0600), the daemons run with the bare URLs (their command lines, which
    `ps` shows everyone, and stack.json hold no password), and the stack works on both servers."""
    from faas_gpu.credentials import read_login

    stack = Up(tmp_path / "home", "--no-gpu", "--etcd", etcd_server.url, "--redis", redis_server.url)
    stack.up()
    try:
        secrets = stack.home / "secrets"
        for name, server in (("etcd-credentials", etcd_server), ("redis-credentials", redis_server)):
            assert read_login(secrets / name).password == server.login.password
            assert (secrets / name).stat().st_mode & 0o777 == 0o600
        passwords = (etcd_server.login.password, redis_server.login.password)
        assert not any(p in (stack.home / "stack.json").read_text() for p in passwords)
        pid = stack.pid("faas-gpu")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert etcd_server.address in cmdline and not any(p in cmdline for p in passwords)
        _deploy_cat(stack, "through-etcd")
        r = requests.post(f"{stack.url('gateway')}/async-function/through-etcd", data=b"q", timeout=10)
        assert r.status_code == 202, r.text  # queued in the authenticated Redis
        log = (stack.home / "faas-gpu.log").read_text()
        assert not any(p in log for p in passwords)
    finally:
        stack.down()


def test_up_says_plainly_whether_functions_are_isolated(tmp_path, monkeypatch):
    """Where replicas cannot be walled off (here: FAAS_GPU_ISOLATION=off, as where the kernel
    refuses namespaces), `up` says so; where they are, it says how."""
    monkeypatch.setenv("FAAS_GPU_ISOLATION", "off")
    stack = Up(tmp_path / "off", "--no-gpu")
    try:
        out = stack.up().stdout
    finally:
        stack.down()
    line = next(line for line in out.splitlines() if line.strip().startswith("functions:"))
    assert "WARNING: functions are NOT isolated" in line and "FAAS_GPU_ISOLATION=off" in line, out
    monkeypatch.delenv("FAAS_GPU_ISOLATION")
    stack = Up(tmp_path / "auto", "--no-gpu")
    try:
        out = stack.up().stdout
        info = requests.get(f"{stack.url('gateway')}/system/info", auth=stack.auth(), timeout=10).json()
    finally:
        stack.down()
    said = info["provider"]["faasGpuIsolation"]
    line = next(line for line in out.splitlines() if line.strip().startswith("functions:"))
    assert line.split("functions:", 1)[1].strip() == said["message"], out
    assert said["isolated"] == ("NOT" not in said["message"]) and said["mode"] in ("uid", "userns", "none")
