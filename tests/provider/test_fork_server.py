"""python3-gpu replicas forked from the node's fork server (issue 44, "replicas share what they can").

A real local runtime (as root: each function its own uid) on its own state folder, with a real
python3-gpu function built into its image store, and real replicas over real HTTP. The handler
reports what its process is and sees: the walls test_tenant_isolation.py checks on an exec'd
replica (its own uid, PID 1 of its namespace, no daemon's environment or descriptor, only its own
secrets, no state folder, seccomp, not dumpable) must hold for a forked one, whose walls were
entered after the fork with no exec between. Its private memory is read from /proc.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from faas_gpu.build import build
from faas_gpu.imagestore import ImageStore
from faas_gpu.sandbox.uids import FIRST_UID, UID_COUNT
from faas_gpu.stack.schema import load_stack
from provider.logs import LogStore
from provider.runtime.forkserver import ForkedProcess, ForkServer
from provider.runtime.local import LocalRuntime
from provider.runtime.processes import probe, uss_bytes
from provider.runtime.replicas import FunctionReplicas
from provider.store import SecretStore
from provider.types import FunctionDeployment, FunctionRecord

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per function needs root"),
]

SECRET_A, SECRET_B = b"s3cr3t-of-tenant-a", b"s3cr3t-of-tenant-b"
STACK = (
    "version: 1.0\nprovider: {name: openfaas}\nfunctions:\n  NAME: {lang: python3-gpu, handler: ./fn, image: NAME}\n"
)
HANDLER = """
import ctypes, json, os

def handle(event, context):
    print("handled", event.body.decode(), flush=True)
    def listing(path):
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            return exc.strerror
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    secrets = {n: open(f"/var/openfaas/secrets/{n}").read() for n in listing("/var/openfaas/secrets")}
    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
    return {"body": {
        "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "groups": os.getgroups(),
        "env": dict(os.environ), "fds": fds, "secrets": secrets,
        "pids": [p for p in os.listdir("/proc") if p.isdigit()],
        "state": listing(os.environ["PROBE_HOME"]),
        "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
        "seccomp": status.get("Seccomp", "").strip(), "no_new_privs": status.get("NoNewPrivs", "").strip(),
        "cap_eff": status.get("CapEff", "").strip(),
        "sys_path0": __import__("sys").path[0],
    }}
"""


def _build(project: Path, name: str, home: Path) -> None:
    (project / "fn").mkdir(parents=True, exist_ok=True)
    (project / "fn" / "handler.py").write_text(HANDLER)
    (project / "stack.yml").write_text(STACK.replace("NAME", name))
    build(load_stack(project / "stack.yml").functions[name], ImageStore(home / "images"), stack_dir=project)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("forkserver")
    home = root / "home"
    home.mkdir(mode=0o700)
    for name in ("tenant-a", "tenant-b"):
        _build(root / name, name, home)
    secrets = SecretStore(home / "function-secrets")
    secrets.write("openfaas-fn", "key-a", SECRET_A)
    secrets.write("openfaas-fn", "key-b", SECRET_B)
    (home / "admin-password").write_text("the admin's")
    runtime = LocalRuntime(home, ImageStore(home / "images"), secrets, LogStore(home / "logs"), isolation="on",
                           fork_server=True)  # fmt: skip
    assert runtime.fork_server.state == "idle"  # until a python3-gpu function is planned
    runtime.plan(FunctionRecord(FunctionDeployment(service="tenant-a", image="tenant-a:latest"), "openfaas-fn", 1))
    _until(lambda: runtime.fork_server.state != "starting", 180)
    assert runtime.fork_server.state == "ready", runtime.fork_server.describe()
    yield runtime, home
    runtime.close()


def _until(check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    return check()


def _start(runtime: LocalRuntime, home: Path, name: str, secret: str, **env: str):
    env_vars = {"PROBE_HOME": str(home), **env}
    dep = FunctionDeployment(service=name, image=f"{name}:latest", secrets=[secret], envVars=env_vars)
    record = FunctionRecord(dep, "openfaas-fn", 1)
    fn = FunctionReplicas(record, runtime.plan(record))
    replica = runtime._spawn(fn)
    assert _until(lambda: probe(replica) or replica.proc.poll() is not None, 60), "never ready"
    assert replica.proc.poll() is None, f"exited with {replica.proc.returncode}"
    return replica


def _replica_pid(replica) -> int:
    """The host's pid of the replica's first process (the relay's child)."""
    return int(Path(f"/proc/{replica.proc.pid}/task/{replica.proc.pid}/children").read_text().split()[0])


def _facts(replica) -> dict:
    r = requests.post(replica.url, data=b"who am i", timeout=30)
    assert r.status_code == 200, r.text
    return json.loads(r.text)


def test_a_forked_replica_answers_and_holds_at_most_40_mb_of_its_own(node):
    runtime, home = node
    replica = _start(runtime, home, "tenant-a", "key-a")
    try:
        assert isinstance(replica.proc, ForkedProcess)  # forked, not exec'd through the launcher
        assert _facts(replica)["pid"] == 1
        uss = uss_bytes(replica.proc.pid)  # the relay and the replica: Private_* of smaps_rollup
        assert 0 < uss <= 40 * 2**20, f"USS {uss / 2**20:.1f} MB"
        # what the handler prints is in the function's log, as an exec'd replica's is
        said = lambda: [m["text"] for m in runtime.logs.read("openfaas-fn", "tenant-a", instance=replica.id)]  # noqa: E731
        assert _until(lambda: any("handled who am i" in t for t in said()), 10), said()
    finally:
        runtime._stop_all([replica], 5)
    assert replica.proc.returncode == 0  # SIGTERM relayed: the watchdog drained and exited


def test_a_forked_replica_has_every_wall_an_execd_one_has(node):
    runtime, home = node
    a = _start(runtime, home, "tenant-a", "key-a")
    b = _start(runtime, home, "tenant-b", "key-b")
    try:
        fa, fb = _facts(a), _facts(b)
        # its function's own uid, no group of the stack's, no capability
        assert FIRST_UID <= fa["uid"] < FIRST_UID + UID_COUNT and fa["gid"] == fa["uid"] and fa["groups"] == []
        assert fb["uid"] != fa["uid"]
        assert int(fa["cap_eff"], 16) == 0 and fa["no_new_privs"] == "1"
        assert fa["seccomp"] == "2" and fa["dumpable"] == 0
        # PID 1 of its own PID namespace: neither the provider, nor the fork server, nor b
        assert fa["pid"] == 1 and str(os.getpid()) not in fa["pids"] and len(fa["pids"]) <= 2
        # only its own secret, at OpenFaaS's path; nothing of the state folder
        assert fa["secrets"] == {"key-a": SECRET_A.decode()} and fb["secrets"] == {"key-b": SECRET_B.decode()}
        assert fa["state"] in ([], ["images"])  # its own image comes back inside it, nothing else
        # its environment is its own (no daemon's, no fork server's), in os.environ and in /proc
        assert "OMP_NUM_THREADS" not in fa["env"] or fa["env"]["OMP_NUM_THREADS"] != "1"
        assert fa["env"]["HOSTNAME"] == a.id and "FAAS_GPU_HOME" not in fa["env"]
        environ = Path(f"/proc/{_replica_pid(a)}/environ").read_bytes()  # what the process started with: zeroed
        assert str(home).encode() not in environ and b"OMP_NUM_THREADS=1" not in environ
        assert not any(k.startswith("FAAS_GPU_ADMIN") for k in fa["env"])
        # descriptors: its output and what it opened itself (sockets of its server), nothing else
        leaked = {fd: target for fd, target in fa["fds"].items() if not target.startswith(("socket:", "pipe:"))}
        leaked = {fd: t for fd, t in leaked.items() if not t.startswith(("/dev/null", "anon_inode:"))}
        assert leaked == {}, leaked
        assert fa["sys_path0"].startswith(str(home / "images"))  # the image first, as `python fwatchdog.py`
        # the relays are the fork server's children, the replicas the relays'
        assert os.readlink(f"/proc/{a.proc.pid}/exe") == os.readlink(f"/proc/{runtime.fork_server.proc.pid}/exe")
    finally:
        runtime._stop_all([a, b], 5)


def test_a_forked_replica_gets_no_descriptor_of_the_server_or_of_another_function(node):
    runtime, home = node
    a = _start(runtime, home, "tenant-a", "key-a")
    b = _start(runtime, home, "tenant-b", "key-b")
    try:
        inode = lambda pid, fd: os.stat(f"/proc/{pid}/fd/{fd}").st_ino  # noqa: E731
        server = runtime.fork_server.proc.pid
        theirs = {inode(server, fd) for fd in os.listdir(f"/proc/{server}/fd")}
        theirs |= {inode(b.proc.pid, fd) for fd in os.listdir(f"/proc/{b.proc.pid}/fd")}
        replica_a = _replica_pid(a)
        mine = {inode(replica_a, fd) for fd in os.listdir(f"/proc/{replica_a}/fd")}
        null = os.stat("/dev/null").st_ino
        assert mine & theirs <= {null}, "a descriptor of the server's or of another function's replica"
    finally:
        runtime._stop_all([a, b], 5)


def _memory(pid: int) -> bytes:
    """Every readable byte of `pid`'s memory (what its own code can read of itself)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if fields[1][0] != "r" or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
    return b"".join(chunks)


def test_the_fork_server_keeps_nothing_of_a_function_for_the_replicas_it_forks_later(node):
    """Every replica starts with the fork server's memory, freed blocks and all. The server
    decoded each request itself: tenant a's envVars (an API key) stayed in its heap after a's
    replica was forked, and after b's too, there for any replica forked later that reads its own
    memory before reusing those blocks (issue 41)."""
    runtime, home = node
    key = ("sk-" + os.urandom(24).hex()).encode()
    a = _start(
        runtime, home, "tenant-a", "key-a", **{f"VAR_{i}": f"value {i}" for i in range(30)}, API_KEY=key.decode()
    )
    try:
        assert _facts(a)["env"]["API_KEY"] == key.decode()  # a has it
        server = runtime.fork_server.proc.pid
        assert key not in _memory(server)
        b = _start(runtime, home, "tenant-b", "key-b")
        try:
            assert key not in _memory(server) and key not in _memory(_replica_pid(b))
        finally:
            runtime._stop_all([b], 5)
    finally:
        runtime._stop_all([a], 5)


def test_a_crashed_fork_server_is_started_again_and_its_replicas_serve_on(node):
    runtime, home = node
    a = _start(runtime, home, "tenant-a", "key-a")
    try:
        old = runtime.fork_server.proc.pid
        os.kill(old, signal.SIGKILL)
        _until(lambda: runtime.fork_server.proc.poll() is not None)
        assert _facts(a)["pid"] == 1  # its relay answers to the provider, not to the server
        b = _start(runtime, home, "tenant-b", "key-b")  # meanwhile: exec'd through the launcher
        try:
            assert not isinstance(b.proc, ForkedProcess)
            assert _facts(b)["uid"] != _facts(a)["uid"]
        finally:
            runtime._stop_all([b], 5)
        assert runtime.isolation().describe()["replicaStart"]["state"] in ("down", "starting")
        # the next request after the back-off starts it again
        _until(lambda: runtime.fork_server.ready(), 180)
        assert runtime.fork_server.proc.pid != old
        c = _start(runtime, home, "tenant-b", "key-b")
        try:
            assert isinstance(c.proc, ForkedProcess)
            assert _facts(c)["secrets"] == {"key-b": SECRET_B.decode()}
        finally:
            runtime._stop_all([c], 5)
    finally:
        runtime._stop_all([a], 5)


def test_a_replica_execd_while_the_server_started_is_replaced_by_a_forked_one(tmp_path, monkeypatch):
    """The first replica after the first python3-gpu deploy is exec'd (the server imports torch
    meanwhile); it must not stay the heavy kind: once the server is ready the supervisor starts a
    forked replica and stops the exec'd one when that serves, the function served throughout.
    The server's start is held here until the exec'd replica serves, so the order is certain."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _build(tmp_path / "a", "tenant-a", home)
    held, start = threading.Event(), ForkServer._start

    def held_start(server: ForkServer) -> None:
        held.wait(120)
        start(server)

    monkeypatch.setattr(ForkServer, "_start", held_start)
    runtime = LocalRuntime(home, ImageStore(home / "images"), SecretStore(home / "function-secrets"),
                           LogStore(home / "logs"), isolation="on", fork_server=True)  # fmt: skip
    try:
        dep = FunctionDeployment(service="tenant-a", image="tenant-a:latest", envVars={"PROBE_HOME": str(home)})
        runtime.apply(FunctionRecord(dep, "openfaas-fn", 1))
        fn = runtime._fns[("openfaas-fn", "tenant-a")]
        assert _until(lambda: runtime.available("openfaas-fn", "tenant-a") == 1, 120), runtime.instances(
            "openfaas-fn", "tenant-a"
        )
        (execd,) = list(fn.replicas)
        assert not isinstance(execd.proc, ForkedProcess) and runtime.fork_server.state == "starting"
        held.set()

        served: list[int] = []

        def replaced() -> bool:
            served.append(runtime.available("openfaas-fn", "tenant-a"))
            now = list(fn.replicas)
            return len(now) == 1 and now[0].ready and isinstance(now[0].proc, ForkedProcess)

        assert _until(replaced, 180), (runtime.fork_server.describe(), [(r.id, r.ready, r.proc) for r in fn.replicas])
        assert min(served) >= 1, "the function had no ready replica while its exec'd one was replaced"
        assert _until(lambda: execd.proc.poll() is not None, 40), "the exec'd replica was not stopped"
        (forked,) = list(fn.replicas)
        assert _facts(forked)["pid"] == 1  # it serves, behind its walls
        assert 0 < uss_bytes(forked.proc.pid) <= 40 * 2**20
        assert runtime.rollout("openfaas-fn", "tenant-a") is None  # one version all along: no rollout said
    finally:
        held.set()
        runtime.close()


def test_system_info_says_how_replicas_start(node):
    runtime, _home = node
    said = runtime.isolation().describe()["replicaStart"]
    assert said["method"] == "fork-server" and said["state"] in ("ready", "starting", "down")


def test_kill_9_of_the_provider_leaves_no_forked_replica_nor_the_server(tmp_path):
    from tests.stack_process import StackProcess

    from .test_process_groups import replica_pids, tree

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _build(tmp_path / "a", "tenant-a", home)
    s = StackProcess(home).start()
    try:
        body = {"service": "tenant-a", "image": "tenant-a:latest", "envVars": {"PROBE_HOME": str(home)}}
        assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202
        s.wait_ready("tenant-a")  # its first replica may be exec'd while the server starts

        def start_state():
            info = s.request("GET", "/system/info").json()["provider"]["faasGpuIsolation"]
            return info["replicaStart"]

        assert _until(lambda: start_state()["state"] == "ready", 180), start_state()
        server = start_state()["pid"]
        scale = f"{s.url}/system/scale-function/tenant-a"
        assert requests.post(scale, json={"serviceName": "tenant-a", "replicas": 3}, auth=s.auth, timeout=10).ok
        s.wait_ready("tenant-a", replicas=3)
        relays = [pid for pid in replica_pids(home) if pid in tree(server)]
        assert relays, "no replica was forked"
        group = [server] + [p for relay in relays for p in tree(relay)]
        assert len(group) >= 3  # the server, a relay, its replica
    finally:
        s.stop(signal.SIGKILL)  # the provider's own group: the server and the relays run in sessions of their own
    assert _until(lambda: not any(Path(f"/proc/{p}").exists() for p in group), 10), "outlived the provider"
