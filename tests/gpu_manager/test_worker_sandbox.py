"""A model worker runs behind walls (issue 41): a loader bug reached by an uploaded artifact gains
nothing. From inside a real worker process (the cpu back end): the state folder's secrets and
datastore cannot be read, etcd and the scheduler on loopback cannot be reached, and nothing can
be written outside the worker's scratch; while the model store stays readable and jobs run.

Before: workers were the manager's children as they were, root with its network and its files.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from faas_gpu.paths import REPO_ROOT
from faas_gpu.walls import Walls, plan
from gpu_manager import isolation
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from tests.gpu_manager.sandbox_probe import attempts
from tests.malicious import exported_linear

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the uid wall is built by a root manager")


@pytest.fixture
def state(tmp_path) -> Path:
    """A state folder as a manager's: secrets, an embedded datastore, a model store."""
    home = tmp_path / ".faas-gpu"
    (home / "secrets").mkdir(parents=True)
    (home / "secrets" / "gpu-manager-token").write_text("the cluster token\n")
    (home / "state.db").write_text("the datastore\n")
    return home


def run_probe(walls: Walls, home: Path, model: Path, targets: list[tuple[str, int]], host_tmp: Path) -> dict:
    ctx = mp.get_context("spawn")  # the workers' own start method (gpu_manager/worker.py)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=attempts, args=(child, walls, str(home), str(model), targets, str(host_tmp)))
    proc.start()
    child.close()
    try:
        assert parent.poll(60), "the probe did not answer"
        return parent.recv()
    finally:
        proc.join(10)


@needs_root
def test_a_worker_cannot_read_the_state_folder_reach_loopback_or_write_outside_its_scratch(state, etcd_server):
    store = ModelStore(state / "models", reader_gid=isolation.WORKER_USER[1])
    artifact = store.put(exported_linear())
    scheduler = socket.create_server(("127.0.0.1", 0))  # a daemon listening on loopback, as the scheduler does
    etcd = urlparse(etcd_server.url)
    targets = [(etcd.hostname, etcd.port), ("127.0.0.1", scheduler.getsockname()[1])]
    for target in targets:  # reachable from here: the walls are what stops the worker
        socket.create_connection(target, timeout=2).close()
    host_tmp = Path(tempfile.gettempdir()) / f"faas-gpu-probe-{uuid.uuid4().hex}"
    os.environ["FAAS_GPU_PROBE_SECRET"] = "the manager's environment"
    try:
        walls = isolation.worker_walls(state, store.root, mode="on")
        seen = run_probe(walls, state, artifact.path, targets, host_tmp)
    finally:
        os.environ.pop("FAAS_GPU_PROBE_SECRET")
        scheduler.close()
    assert seen["read token"].startswith("refused") and seen["read datastore"].startswith("refused"), seen
    assert seen["list state"] == "ok ['models']", seen  # only the store is shown again
    assert seen["read model"] == f"ok {artifact.size}"
    for _, port in targets:
        assert seen[f"connect {port}"].startswith("refused"), seen
    for where in (state, artifact.path.parent, REPO_ROOT, "/var/tmp"):
        assert seen[f"write {where}"].startswith("refused"), seen
    assert seen["write scratch"].startswith("ok") and seen["write host tmp"].startswith("ok")
    assert not host_tmp.exists()  # its /tmp is its own
    assert "FAAS_GPU_PROBE_SECRET" not in seen["environment"]
    status = json.loads(seen["status"])
    assert status["Uid"] == [str(isolation.WORKER_USER[0])] * 4 and status["Gid"] == [str(isolation.WORKER_USER[1])] * 4
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == ["0000000000000000"]
    assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"]
    assert seen["processes"] == "1"  # /proc shows no other uid's processes: not the manager's command line
    assert list(state.glob("pwned-*")) == [] and list(REPO_ROOT.glob("pwned-*")) == []


@needs_root
def test_the_workers_of_a_manager_run_jobs_behind_the_walls(state):
    """The real thing: a manager with its walls, a pooled and a fresh worker, each loading and
    serving a model; seen from outside, each runs as the workers' uid in namespaces of its own."""
    walls = isolation.worker_walls(state, state / "models", mode="on")
    walls, isolated = isolation.checked(walls, "on")
    assert isolated is not None and isolated.isolated and isolated.namespaces == ("mnt", "net", "ipc")
    store = ModelStore(state / "models", reader_gid=walls.gid)
    torch.manual_seed(0)
    models = [torch.nn.Linear(2, 2).eval() for _ in range(2)]
    digests = []
    for m in models:
        program = torch.export.export(m, (torch.randn(2, 2),), dynamic_shapes=({0: torch.export.Dim("b")},))
        path = state / "upload.pt2"
        torch.export.save(program, path)
        digests.append(store.put(path.read_bytes()).digest)
    manager = GPUManager(cpu_units(2, 512), store, warm_workers=1, walls=walls)
    try:
        manager.pool.refill({}, wait=True)
        x = torch.randn(3, 2)
        for digest, unit, m in zip(digests, ("cpu-0", "cpu-1"), models, strict=True):
            result = manager.run(digest, unit, encode(x))
            assert torch.allclose(decode(result.payload), m(x), atol=1e-6)
        for (digest, unit), worker in manager.workers.items():
            pid = worker.proc.pid
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            assert status["Uid"].split() == [str(walls.uid)] * 4, (digest, unit)
            assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
            assert int(status["CapEff"], 16) == 0
            for ns in ("net", "mnt", "ipc"):
                assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
    finally:
        manager.close()


def test_a_folder_the_worker_could_not_cross_is_covered_and_only_the_kept_path_rebuilt(tmp_path):
    """pytest's own tmp folder is 0700: the model store under it is shown to the worker's uid by
    covering the first folder it cannot cross and binding the store back at its own path."""
    locked = tmp_path / "locked"
    store = locked / "home" / "models"
    store.mkdir(parents=True)
    locked.chmod(0o700)
    covers, binds = plan(Walls(hide=(), read_only=(str(store),), scratch=()), uid=64999, gid=64999)
    assert covers == [str(tmp_path)] or any(str(locked).startswith(c) for c in covers)
    assert binds == [(str(store), False)]
    covers, binds = plan(Walls(hide=(str(locked / "home"),), read_only=(str(store),), scratch=()), os.getuid(), 0)
    assert covers == [str(locked / "home")] and binds == [(str(store), False)]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux's setpriv runs the unprivileged manager")
@needs_root
def test_an_unprivileged_managers_workers_are_walled_by_a_user_namespace(etcd_server):
    """A manager that is not root: the same namespaces, made in a user namespace of the worker's
    own (or, where the kernel refuses, a plain statement that the walls are missing)."""
    home = Path(tempfile.mkdtemp(prefix="faas-gpu-unprivileged-", dir="/var/tmp"))  # not under the scratch
    try:
        (home / "secrets").mkdir()
        (home / "secrets" / "gpu-manager-token").write_text("the cluster token\n")
        (home / "models").mkdir()
        (home / "models" / "m.pt").write_text("a model")
        subprocess.run(["chown", "-R", "65534:65534", str(home)], check=True)
        etcd = urlparse(etcd_server.url)
        script = f"""
import json, os, socket
from pathlib import Path
from gpu_manager import isolation
from faas_gpu.walls import enter
home = Path({str(home)!r})
walls = isolation.worker_walls(home, home / "models")
got = enter(walls)
out = {{"namespaces": got.namespaces, "missing": got.missing, "uid": os.getuid()}}
for what, action in [
    ("token", lambda: (home / "secrets" / "gpu-manager-token").read_text()),
    ("model", lambda: (home / "models" / "m.pt").read_text()),
    ("etcd", lambda: socket.create_connection(({etcd.hostname!r}, {etcd.port}), timeout=2).close()),
    ("write home", lambda: (home / "pwned").write_text("x")),
    ("write models", lambda: (home / "models" / "pwned").write_text("x")),
]:
    try:
        out[what] = "ok " + repr(action())
    except OSError as exc:
        out[what] = "refused " + type(exc).__name__
print(json.dumps(out))
"""
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), "HOME": str(home)}
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        if not seen["namespaces"]:  # a kernel that refuses user namespaces: said, not hidden
            assert any("namespaces refused" in m for m in seen["missing"])
            pytest.skip(f"this kernel refuses unprivileged user namespaces: {seen['missing']}")
        assert seen["namespaces"] == ["user", "mnt", "net", "ipc"] and seen["uid"] == 65534
        assert seen["token"].startswith("refused") and seen["model"] == "ok 'a model'"
        assert seen["etcd"].startswith("refused")
        assert seen["write home"].startswith("refused") and seen["write models"].startswith("refused"), seen
        assert not (home / "pwned").exists() and not (home / "models" / "pwned").exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_root
def test_where_namespaces_are_refused_the_worker_keeps_root_without_capabilities_and_says_so(state):
    """A root manager in a container without CAP_SYS_ADMIN: no mount namespace, so no other uid
    could reach the model store; the worker keeps uid 0 with no capability left, and the walls it
    lacks are named (the manager logs them: `isolation.checked`)."""
    from tests.gpu_manager.sandbox_probe import where_namespaces_are_refused

    walls = isolation.worker_walls(state, state / "models")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=where_namespaces_are_refused, args=(child, walls))
    proc.start()
    try:
        assert parent.poll(60)
        got, status = parent.recv()
    finally:
        proc.join(10)
    assert not got.isolated and got.namespaces == ()
    assert any("namespaces refused" in m for m in got.missing) and any("uid stays root" in m for m in got.missing)
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split() == ["0"] * 4
    assert int(fields["CapEff"], 16) == int(fields["CapPrm"], 16) == int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1"


@needs_root
def test_with_mps_a_worker_keeps_uid_0_without_capabilities_and_reaches_only_its_mps_folder(state):
    """Under MPS (untestable here without a GPU: its folders stand in) the worker keeps the
    manager's uid and the host's IPC, and its MPS folder stays writable; the rest of the walls stand."""
    from tests.gpu_manager.sandbox_probe import under_mps

    mps = state / "mps"
    mps.mkdir()
    walls = isolation.worker_walls(state, state / "models", mps=mps)
    assert walls.uid is None and walls.ipc and walls.scratch == ("/tmp",) and walls.writable == (str(mps), "/dev/shm")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=under_mps, args=(child, walls, str(state), str(mps)))
    proc.start()
    try:
        assert parent.poll(60)
        seen, status = parent.recv()
    finally:
        proc.join(10)
    assert seen["token"] == "refused FileNotFoundError" and seen["write mps"] == seen["write shm"] == "ok", seen
    assert not (state / "pwned").exists()  # (under pytest's /tmp, the worker wrote into its own scratch)
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split() == ["0"] * 4 and int(fields["CapEff"], 16) == int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    assert len(list(mps.iterdir())) == 1  # written through to the real folder: MPS's pipes live there
