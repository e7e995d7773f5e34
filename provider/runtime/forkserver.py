"""The process runtime's side of the fork server (`faas_gpu.sandbox.zygote`): start it, keep it
running, ask it for a replica, and watch that replica as a process it did not fork.

Which replicas it starts (`forkable`): isolated ones (their walls are entered after the fork; an
unisolated replica would be a fork of a root process with nothing between it and the stack) of a
python3-gpu image (the template's watchdog in mode inproc, in a function environment of this
interpreter). Everything else, and every replica while the server is starting, restarting or
refuses (a function environment with its own copy of a package the server has loaded), is
exec'd through the launcher as before: the answer a caller gets never depends on which. A
replica exec'd only because the server was not ready yet (`NotReady`: the first replica after
the first python3-gpu deploy, always, as the server imports torch meanwhile) does not stay so:
once the server is ready the supervisor replaces it with a forked one as in a rollout, the new
replica first and the exec'd one stopped once the new one is ready (`LocalRuntime`).

The server runs as the provider's user, in its own session, with a clean environment; its socket
is in the state folder's `forkserver/` (0700), and it serves only its parent (SO_PEERCRED). A
server that dies is started again on the next request after a back-off; the replicas it forked
run on (their relays are not its children's children: they answer to the provider's connection).
"""

from __future__ import annotations

import logging
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from faas_gpu import paths
from faas_gpu.contract.replica import STANDARD_PATH
from faas_gpu.sandbox.replica import Sandbox
from faas_gpu.sandbox.zygote import ZYGOTE_MODULE

from .launch import LaunchSpec

log = logging.getLogger(__name__)

TEMPLATE = paths.TEMPLATES_DIR / "python3-gpu"
"""The template whose replicas the server forks (its watchdog package is loaded by the server)."""
START_TIMEOUT_S = 120.0
RESTART_BACKOFF_S = (1.0, 5.0, 30.0)


class Unavailable(Exception):
    """No replica from the fork server this time: the runtime execs it instead."""


class NotReady(Unavailable):
    """The server is starting, or down until it is started again: a replica exec'd for this reason
    alone is replaced by a forked one once it is ready (`LocalRuntime`). Not for a refusal or a
    broken connection, which would refuse its replacement too."""


def forkable(spec: LaunchSpec) -> str | None:
    """None when `spec`'s replicas may be forked; else why not (said by describe)."""
    if spec.image is None or spec.cwd is None:
        return "no image"
    if len(spec.argv) != 2 or os.path.basename(spec.argv[1]) != "fwatchdog.py":
        return "not the python3-gpu watchdog"
    if spec.env.get("mode") != "inproc" or spec.env.get("fprocess") != "python index.py":
        return "not the python3-gpu template in mode inproc"
    if os.path.realpath(spec.argv[0]) != os.path.realpath(sys.executable):
        return "a function environment of another interpreter"
    if not (spec.cwd / "index.py").is_file() or not (spec.cwd / "faas_gpu_watchdog").is_dir():
        return "not the python3-gpu template"
    return None


def site_folders(python: str) -> list[str]:
    """The function environment's own site-packages (its venv's, beside `python`'s bin folder)."""
    venv = Path(python).parent.parent
    return [str(p) for p in sorted(venv.glob("lib/python*/site-packages"))]


class ForkedProcess:
    """A replica the fork server started, seen as `subprocess.Popen` sees its child: `pid` (its
    relay, leading its process group), `poll`, `wait`, `send_signal`, `stdout`. Its status comes
    on the request's connection, which is also its lifeline: the relay kills the replica when the
    provider's end closes."""

    def __init__(self, conn: socket.socket, pid: int, stdout_fd: int):
        self.conn, self.pid = conn, pid
        self.stdout = os.fdopen(stdout_fd, "rb")
        self.returncode: int | None = None
        self.args = ["fork server"]
        self._lock = threading.Lock()

    def _read(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            if not select.select([self.conn], [], [], timeout)[0]:
                return
            try:
                raw = self.conn.recv(4096)
            except OSError:
                raw = b""
            code = -signal.SIGKILL  # the relay died without a word (killed)
            if raw:
                try:
                    said = marshal.loads(raw)
                    code = int(said["exit"])
                except (EOFError, ValueError, TypeError, KeyError):
                    pass
            self.returncode = code  # the connection stays open: the relay (and its pid) lives until it closes

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        self.conn.close()
        self.stdout.close()


class ForkServer:
    """The node's fork server, started in the background when the first python3-gpu function is
    planned (`wanted`); replicas are exec'd until it is ready."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.socket_path = str(folder / "socket")
        self.proc: subprocess.Popen | None = None
        self.state = "starting"
        self.reason = "starting"
        self.restarts = 0
        self._next_start = 0.0
        self._lock = threading.Lock()
        self._closed = False
        self._starter: threading.Thread | None = None
        self.state, self.reason = "idle", "no python3-gpu replica started yet"

    def wanted(self) -> None:
        """Start the server if it is not running yet: a python3-gpu function was planned. Lazily,
        so that a node that runs no such function never loads torch for it."""
        with self._lock:
            idle = self.state == "idle" and not self._closed
            if idle:
                self.state, self.reason = "starting", "the fork server is starting"
        if idle:
            self._begin()

    # -- the server's life ------------------------------------------------------------------
    def _begin(self) -> None:
        self._starter = threading.Thread(target=self._start, name="fork-server", daemon=True)
        self._starter.start()

    def _start(self) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        env = {"PATH": STANDARD_PATH, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        argv = [sys.executable, "-m", ZYGOTE_MODULE, self.socket_path, str(TEMPLATE)]
        try:
            proc = subprocess.Popen(
                argv, cwd="/", env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            self._failed(f"cannot start the fork server: {exc}")
            return
        with self._lock:
            self.proc = proc
        ready = select.select([proc.stdout], [], [], START_TIMEOUT_S)[0]
        line = proc.stdout.readline() if ready else b""
        with self._lock:
            if self._closed or self.proc is not proc:
                return
            if line.strip() == b"ready":
                self.state, self.reason = "ready", ""
                log.info("fork server ready (pid %d): python3-gpu replicas are forked", proc.pid)
                return
        _stop(proc)
        self._failed(f"the fork server did not start (exit status {proc.poll()})")

    def _failed(self, why: str) -> None:
        with self._lock:
            self.state, self.reason = "down", why
            self.restarts += 1
            self._next_start = time.monotonic() + RESTART_BACKOFF_S[min(self.restarts, len(RESTART_BACKOFF_S)) - 1]
        log.warning("%s; replicas are exec'd until it runs", why)

    def _check(self) -> None:
        """Notice a server that died, and start one again after its back-off."""
        with self._lock:
            if self._closed:
                raise Unavailable("closing")
            proc = self.proc
            if self.state == "ready" and proc is not None and proc.poll() is not None:
                self.state = "down"
                self.reason = f"the fork server exited with {proc.returncode}"
                self.restarts += 1
                self._next_start = time.monotonic() + RESTART_BACKOFF_S[min(self.restarts, len(RESTART_BACKOFF_S)) - 1]
                log.warning("%s; starting it again, replicas are exec'd meanwhile", self.reason)
            restart = self.state == "down" and time.monotonic() >= self._next_start
            restart = restart or self.state == "idle"
            if restart:  # under the lock: one start, whoever else asks meanwhile
                self.state, self.reason = "starting", "the fork server is starting"
            state, reason = self.state, self.reason
        if restart:
            self._begin()
        if state != "ready":
            raise NotReady(reason)

    def ready(self) -> bool:
        """Whether replicas are forked now (a dead server noticed, and started again when due)."""
        try:
            self._check()
        except Unavailable:
            return False
        return True

    def describe(self) -> dict[str, object]:
        with self._lock:
            pid = self.proc.pid if self.proc is not None and self.state == "ready" else None
            return {"method": "fork-server", "state": self.state, "reason": self.reason, "pid": pid}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc = self.proc
        if proc is not None:
            _stop(proc)

    # -- a replica --------------------------------------------------------------------------
    def spawn(self, box: Sandbox, site: list[str]) -> ForkedProcess:
        """Ask for `box` forked; Unavailable: exec it instead (the server is down or refused)."""
        self._check()
        files = [os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600) for path in
                 (box.files[n] for n in sorted(box.files))]  # fmt: skip
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(30)
            conn.connect(self.socket_path)
            request = marshal.dumps({"sandbox": box.encode(), "site": site})
            socket.send_fds(conn, [request], [out_w, *files])
            raw = conn.recv(65536)
            said = marshal.loads(raw) if raw else {"error": "the fork server closed the connection", "fallback": True}
        except (OSError, EOFError, ValueError) as exc:
            conn.close()
            os.close(out_r)
            raise Unavailable(f"fork server: {exc}") from None
        finally:
            os.close(out_w)
            for fd in files:
                os.close(fd)
        if not isinstance(said, dict) or not isinstance(said.get("pid"), int):
            conn.close()
            os.close(out_r)
            why = said.get("error") if isinstance(said, dict) else None
            raise Unavailable(f"fork server: {why or 'no answer'}")
        conn.settimeout(None)
        return ForkedProcess(conn, said["pid"], out_r)


def _stop(proc: subprocess.Popen) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(2)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
