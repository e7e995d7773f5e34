"""What a loader bug would try from inside a model worker, run in a child spawned as the workers
are and behind the same walls (`gpu_manager.worker._walled`). Apart from the tests' module: a
spawned child imports its target's module, and torch's import starts a thread, while the walls
are entered single-threaded (as a worker enters them, before it imports torch)."""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

from faas_gpu.paths import REPO_ROOT
from faas_gpu.walls import Walls
from gpu_manager.worker import _walled


def attempts(conn, walls: Walls, home: str, model: str, targets: list[tuple[str, int]], host_tmp: str) -> None:
    """The probe: run in a child spawned as the workers are, behind the same walls, what a
    loader bug would try. Answers {what: outcome} over the pipe."""
    os.umask(0o077)  # as the daemons run (`paths.private_umask`): the walls may not depend on it
    _walled(walls)
    out: dict[str, str] = {}

    def attempt(what: str, action) -> None:
        try:
            result = action()
            out[what] = f"ok {result!r}"[:200]
        except OSError as exc:
            out[what] = f"refused {type(exc).__name__}: {exc.strerror}"

    attempt("read token", lambda: Path(home, "secrets", "gpu-manager-token").read_text())
    attempt("read datastore", lambda: Path(home, "state.db").read_text())
    attempt("list state", lambda: sorted(os.listdir(home)))
    attempt("read model", lambda: len(Path(model).read_bytes()))
    for host, port in targets:
        attempt(f"connect {port}", lambda h=host, p=port: socket.create_connection((h, p), timeout=2).close())
    for where in (home, str(Path(model).parent), str(REPO_ROOT), "/var/tmp", os.path.dirname(host_tmp)):
        attempt(f"write {where}", lambda w=where: Path(w, f"pwned-{uuid.uuid4().hex}").write_text("x"))
    attempt("write scratch", lambda: Path(os.environ["TMPDIR"], "scratch").write_text("x"))
    attempt("write host tmp", lambda: Path(host_tmp).write_text("x"))
    attempt("environment", lambda: sorted(os.environ))
    status = Path("/proc/self/status").read_text().splitlines()
    out["status"] = json.dumps({k: v.split() for k, v in (line.split(":", 1) for line in status)})
    out["processes"] = str(len([p for p in os.listdir("/proc") if p.isdigit()]))
    conn.send(out)


def where_namespaces_are_refused(conn, walls: Walls) -> None:
    """`enter(walls)` on a host that refuses namespaces (a container's seccomp profile; here a
    filter of our own that refuses unshare): answers (Isolation, /proc/self/status)."""
    from faas_gpu import walls as sandbox

    sandbox._prctl(sandbox.PR_SET_NO_NEW_PRIVS, 1)
    sandbox._install_seccomp(sandbox._seccomp_filter())
    got = sandbox.enter(walls)
    conn.send((got, Path("/proc/self/status").read_text()))


def under_mps(conn, walls: Walls, home: str, mps: str) -> None:
    """The MPS case: what the worker may still do (its unit's MPS folder, the host's /dev/shm) and
    may not (the rest of the state folder); answers (outcomes, /proc/self/status)."""
    os.umask(0o077)
    _walled(walls)
    out = {}
    for what, action in (
        ("token", lambda: Path(home, "secrets", "gpu-manager-token").read_text()),
        ("write mps", lambda: Path(mps, f"client-{uuid.uuid4().hex}").write_text("x")),
        ("write shm", lambda: _written_and_gone(Path("/dev/shm", f"faas-gpu-probe-{uuid.uuid4().hex}"))),
        ("write home", lambda: Path(home, "pwned").write_text("x")),
    ):
        try:
            action()
            out[what] = "ok"
        except OSError as exc:
            out[what] = f"refused {type(exc).__name__}"
    conn.send((out, Path("/proc/self/status").read_text()))


def _written_and_gone(path: Path) -> None:
    path.write_text("x")
    path.unlink()
