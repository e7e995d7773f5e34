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

Every command goes through one `Runner` so that tests fake at the subprocess boundary.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)
CONTROL = "nvidia-cuda-mps-control"
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


def thread_percentage(value: int | float | str) -> int:
    pct = int(value)
    if not 1 <= pct <= 100:
        raise ValueError(f"mps: the active thread percentage is 1..100, not {value}")
    return pct


class MPSDaemon:
    """The MPS control daemon of one unit (a whole GPU or a MIG device, by its UUID)."""

    def __init__(self, unit: str, root: Path, runner: Runner = subprocess_runner):
        self.unit, self.runner = unit, runner
        # a short, stable folder name: the pipe directory's sockets must fit in sun_path
        self.dir = Path(root) / hashlib.sha1(unit.encode()).hexdigest()[:12]
        self.pipe_dir, self.log_dir = self.dir / "pipe", self.dir / "log"
        self.running = False

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
        if self.running:
            return
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o700)
        (self.dir / "unit").write_text(self.unit + "\n")
        if len(str(self.pipe_dir / "control")) > SOCKET_PATH_MAX:
            log.warning("mps %s: pipe directory %s is long for a socket path", self.unit, self.pipe_dir)
        if (self.pipe_dir / "control").exists():  # a daemon a previous manager left behind: ours to end
            try:
                self.control("quit")
            except MPSError as exc:
                log.info("mps %s: no stale daemon to quit (%s)", self.unit, exc)
        r = self._run([CONTROL, "-d"])
        if r.returncode != 0:
            raise MPSError(
                f"mps {self.unit}: {CONTROL} -d failed ({r.returncode}): {(r.stderr or r.stdout).strip()} "
                f"(see {self.log_dir / 'control.log'})"
            )
        self.running = True
        log.info("mps %s: control daemon started (pipes in %s)", self.unit, self.pipe_dir)

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        self.control("quit")
        log.info("mps %s: control daemon stopped", self.unit)

    def set_active_thread_percentage(self, server_pid: int, pct: int) -> None:
        """A running MPS server's default share for the clients it has not yet served."""
        self.control(f"set_active_thread_percentage {int(server_pid)} {thread_percentage(pct)}")

    def servers(self) -> list[int]:
        """The pids of this daemon's MPS servers."""
        return [int(tok) for tok in self.control("get_server_list").split() if tok.isdigit()]


class MPSControl:
    """The manager's MPS daemons, one per unit, started on first use and stopped on shutdown."""

    def __init__(self, root: Path, runner: Runner = subprocess_runner):
        self.root, self.runner = Path(root), runner
        self.daemons: dict[str, MPSDaemon] = {}
        self._lock = threading.Lock()

    def ensure(self, unit: str) -> MPSDaemon:
        with self._lock:
            daemon = self.daemons.get(unit)
            if daemon is None:
                daemon = self.daemons[unit] = MPSDaemon(unit, self.root, self.runner)
            daemon.start()
            return daemon

    def stop(self, unit: str) -> None:
        with self._lock:
            daemon = self.daemons.pop(unit, None)
        if daemon is not None:
            try:
                daemon.stop()
            except MPSError as exc:
                log.warning("%s", exc)

    def stop_all(self) -> None:
        for unit in list(self.daemons):
            self.stop(unit)
