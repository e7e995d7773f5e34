"""CUDA MPS on the GPU Manager's units: one MPS control daemon per unit, each with its own pipes.

PROTEAN (seed 000, §2) shares each MIG slice between model processes through MPS: the slice's
memory is isolated by MIG, its SMs are shared by MPS. MPS on MIG takes one control daemon per
MIG device, started with `CUDA_VISIBLE_DEVICES` naming that device and its own
`CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` (here under the manager's home), started
with `nvidia-cuda-mps-control -d` and stopped with `echo quit | nvidia-cuda-mps-control`.
A model's worker joins its unit's daemon through the same pipe directory in its environment;
its share of the SMs is `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (read when its CUDA context is
created, so a new share takes a new worker). A server's default share can also be set through
the control pipe (`set_active_thread_percentage <server pid> <pct>`).

A daemon's lifecycle, as the MPS documentation has it rather than as exit codes suggest:
- *start*: `-d` exiting 0 means the control daemon forked, not that anything serves: the MPS
  server starts only when the first client connects. The daemon is tracked (`running`) from
  then on, and confirmed when its control pipe answers `get_server_list`; one that never
  answers is an MPSError (and is stopped, or stays tracked until it is).
- *stop*: `quit`; if the daemon is still there after `quit_wait_s`, `quit -t <quit_timeout_s>`
  (the daemon forces its servers down after that many seconds); if still there, SIGTERM then
  SIGKILL to the control daemon's pid and its servers' pids. It stays tracked until it is gone;
  a daemon that would not go is an MPSError and is still tracked, to be stopped again.
- *its pid*: `nvidia-cuda-mps-control -d` prints none. It is read from
  `<pipe dir>/nvidia-cuda-mps-control.pid` where the daemon leaves one, else found in /proc: the
  process whose argv[0] is nvidia-cuda-mps-control and whose environment names this daemon's
  `CUDA_MPS_PIPE_DIRECTORY` (the daemon inherits it from us; the pipe directory is ours alone).
  Without a pid, "gone" means the control pipe no longer answers.

Every command goes through one `Runner` so that tests fake at the subprocess boundary; finding,
probing and signalling pids through `Processes`, for the same reason.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)
CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_PATH_MAX = 100  # sockets in the pipe directory: sun_path holds 108 bytes


class MPSError(RuntimeError):
    pass


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""


class Runner(Protocol):
    def __call__(self, argv: list[str], env: dict[str, str], input: str | None = None) -> RunResult: ...


def subprocess_runner(argv: list[str], env: dict[str, str], input: str | None = None) -> RunResult:
    """The real runner: a child process, its output captured; a missing program is an MPSError."""
    try:
        done = subprocess.run(argv, env=env, input=input, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise MPSError(f"mps: {argv[0]} is not installed (it comes with the NVIDIA driver)") from None
    except subprocess.TimeoutExpired:
        raise MPSError(f"mps: {' '.join(argv)} did not finish within 60s") from None
    return RunResult(done.returncode, done.stdout, done.stderr)


def control_daemon_pid(pipe_dir: Path, proc: Path = Path("/proc")) -> int | None:
    """The pid of the control daemon serving `pipe_dir` (see the module's docstring), or None."""
    try:
        return int((pipe_dir / PID_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    want = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            if os.path.basename(argv0) != CONTROL.encode():
                continue
            if want in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:  # gone meanwhile, or another user's
            continue
    return None


def pid_alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not: its parent has yet to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Processes:
    """How a daemon's pid is found, probed and signalled (tests replace these)."""

    find: Callable[[Path], int | None] = control_daemon_pid
    alive: Callable[[int], bool] = pid_alive
    kill: Callable[[int, int], None] = _kill
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


@dataclass
class Timeouts:
    """Seconds: answer_s for the control pipe to answer after `-d`; quit_wait_s after `quit`;
    quit_timeout_s given to `quit -t` (and waited for, plus kill_wait_s); kill_wait_s after each signal."""

    answer_s: float = 10.0
    quit_wait_s: float = 5.0
    quit_timeout_s: float = 10.0
    kill_wait_s: float = 5.0
    poll_s: float = 0.1


def thread_percentage(value: int | float | str) -> int:
    pct = int(value)
    if not 1 <= pct <= 100:
        raise ValueError(f"mps: the active thread percentage is 1..100, not {value}")
    return pct


class MPSDaemon:
    """The MPS control daemon of one unit (a whole GPU or a MIG device, by its UUID)."""

    def __init__(
        self,
        unit: str,
        root: Path,
        runner: Runner = subprocess_runner,
        processes: Processes | None = None,
        timeouts: Timeouts | None = None,
    ):
        self.unit, self.runner = unit, runner
        self.processes, self.timeouts = processes or Processes(), timeouts or Timeouts()
        # a short, stable folder name: the pipe directory's sockets must fit in sun_path
        self.dir = Path(root) / hashlib.sha1(unit.encode()).hexdigest()[:12]
        self.pipe_dir, self.log_dir = self.dir / "pipe", self.dir / "log"
        self.running = False  # a control daemon of ours may exist: tracked until it is gone
        self.answering = False  # its control pipe answered since it started
        self.pid: int | None = None  # the control daemon's, where found
        self.server_pids: list[int] = []  # its MPS servers', as last listed

    def env(self) -> dict[str, str]:
        """What a process needs to reach this daemon: its pipe and log directories and its device."""
        return {
            "CUDA_VISIBLE_DEVICES": self.unit,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def client_env(self, active_thread_percentage: int | None = None) -> dict[str, str]:
        """A worker's environment on this unit; the percentage caps its share of the SMs."""
        env = self.env()
        if active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(thread_percentage(active_thread_percentage))
        return env

    def _run(self, argv: list[str], input: str | None = None) -> RunResult:
        return self.runner(argv, {**os.environ, **self.env()}, input)

    def control(self, command: str) -> str:
        """One command through the control pipe (`echo <command> | nvidia-cuda-mps-control`)."""
        r = self._run([CONTROL], input=command + "\n")
        if r.returncode != 0:
            raise MPSError(f"mps {self.unit}: {command!r} failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
        return r.stdout

    def start(self) -> None:
        """Start the control daemon and confirm it answers; idempotent. MPSError if it fails to
        start, or starts but does not answer within `timeouts.answer_s` (it is then still tracked)."""
        if self.running:
            if not self.answering:
                self._confirm()
            return
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o700)
        (self.dir / "unit").write_text(self.unit + "\n")
        if len(str(self.pipe_dir / "control")) > SOCKET_PATH_MAX:
            log.warning("mps %s: pipe directory %s is long for a socket path", self.unit, self.pipe_dir)
        if (self.pipe_dir / "control").exists():  # a daemon a previous manager left behind: ours to end
            self.running = True  # as ours: the same escalation (MPSError if it will not go)
            self.stop()
        r = self._run([CONTROL, "-d"])
        if r.returncode != 0:
            raise MPSError(
                f"mps {self.unit}: {CONTROL} -d failed ({r.returncode}): {(r.stderr or r.stdout).strip()} "
                f"(see {self.log_dir / 'control.log'})"
            )
        self.running = True  # it forked: ours to stop from here on, whatever follows
        self._confirm()
        self.pid = self.processes.find(self.pipe_dir)
        log.info(
            "mps %s: control daemon started and answering (pid %s, pipes in %s)", self.unit, self.pid, self.pipe_dir
        )

    def _confirm(self) -> None:
        """The control pipe answers `get_server_list` (the server itself starts at the first client)."""
        t, p = self.timeouts, self.processes
        deadline = p.clock() + t.answer_s
        while True:
            try:
                self.server_pids = self._server_list()
                self.answering = True
                return
            except MPSError as exc:
                if p.clock() >= deadline:
                    raise MPSError(
                        f"mps {self.unit}: started ({CONTROL} -d exited 0) but its control pipe does not "
                        f"answer get_server_list: {exc} (see {self.log_dir / 'control.log'})"
                    ) from None
            p.sleep(t.poll_s)

    def _server_list(self) -> list[int]:
        return [int(tok) for tok in self.control("get_server_list").split() if tok.isdigit()]

    def _gone(self, wait_s: float) -> bool:
        """Whether the daemon is gone within `wait_s`: its pid ended, or without a pid its pipe is silent."""
        p = self.processes
        deadline = p.clock() + wait_s
        while True:
            if self.pid is not None:
                if not p.alive(self.pid):
                    return True
            else:
                try:
                    self.control("get_server_list")
                except MPSError:
                    return True
            if p.clock() >= deadline:
                return False
            p.sleep(self.timeouts.poll_s)

    def stop(self) -> None:
        """quit, then quit -t, then SIGTERM and SIGKILL by pid; tracked until gone (else MPSError)."""
        if not self.running:
            return
        t, p = self.timeouts, self.processes
        if self.pid is None:
            self.pid = p.find(self.pipe_dir)
        try:
            self.server_pids = self._server_list()
        except MPSError:
            pass
        forced = f"quit -t {t.quit_timeout_s:g}"
        steps: list[tuple[str, Callable[[], object], float]] = [
            ("quit", lambda: self.control("quit"), t.quit_wait_s),
            (forced, lambda: self.control(forced), t.quit_timeout_s + t.kill_wait_s),
        ]
        if self.pid is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                steps.append((sig.name, lambda sig=sig: self._signal(sig), t.kill_wait_s))
        tried = []
        for name, act, wait_s in steps:
            try:
                act()
            except MPSError as exc:  # not answering: the next step, and still see whether it went
                log.info("mps %s: %s failed (%s)", self.unit, name, exc)
            tried.append(name)
            if self._gone(wait_s):
                self._forget(tried)
                return
        raise MPSError(
            f"mps {self.unit}: the control daemon (pid {self.pid}) is still there after {', '.join(tried)}; "
            "still tracked"
        )

    def _signal(self, sig: int) -> None:
        for pid in [*self.server_pids, self.pid]:
            if pid is not None:
                self.processes.kill(pid, sig)

    def _forget(self, tried: list[str]) -> None:
        self.running = self.answering = False
        self.pid, self.server_pids = None, []
        level = logging.INFO if tried == ["quit"] else logging.WARNING
        log.log(level, "mps %s: control daemon stopped (after %s)", self.unit, ", ".join(tried))

    def set_active_thread_percentage(self, server_pid: int, pct: int) -> None:
        """A running MPS server's default share for the clients it has not yet served."""
        self.control(f"set_active_thread_percentage {int(server_pid)} {thread_percentage(pct)}")

    def servers(self) -> list[int]:
        """The pids of this daemon's MPS servers (none until the first client connects)."""
        self.server_pids = self._server_list()
        return self.server_pids


class MPSControl:
    """The manager's MPS daemons, one per unit, started on first use and stopped on shutdown.
    A daemon stays in `daemons` until it is gone: one that would not stop is stopped again later."""

    def __init__(
        self,
        root: Path,
        runner: Runner = subprocess_runner,
        processes: Processes | None = None,
        timeouts: Timeouts | None = None,
    ):
        self.root, self.runner = Path(root), runner
        self.processes, self.timeouts = processes, timeouts
        self.daemons: dict[str, MPSDaemon] = {}
        self._lock = threading.Lock()

    def ensure(self, unit: str) -> MPSDaemon:
        with self._lock:
            daemon = self.daemons.get(unit)
            if daemon is None:
                daemon = self.daemons[unit] = MPSDaemon(unit, self.root, self.runner, self.processes, self.timeouts)
            try:
                daemon.start()
            except MPSError:
                if daemon.running:  # started but not answering: end it rather than serve through it
                    try:
                        daemon.stop()
                    except MPSError as exc:
                        log.warning("%s", exc)
                if not daemon.running:
                    self.daemons.pop(unit, None)
                raise
            return daemon

    def stop(self, unit: str) -> None:
        with self._lock:
            daemon = self.daemons.get(unit)
        if daemon is None:
            return
        try:
            daemon.stop()
        except MPSError as exc:
            log.warning("%s", exc)
        with self._lock:
            if not daemon.running and self.daemons.get(unit) is daemon:
                del self.daemons[unit]

    def stop_all(self) -> None:
        for unit in list(self.daemons):
            self.stop(unit)
