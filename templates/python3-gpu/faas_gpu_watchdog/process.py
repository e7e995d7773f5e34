"""Process supervision: the function process of http mode (forked once, its output logged, its
exit the watchdog's), and every child dying with the watchdog. The watchdog dies with the stack
that started it through its launcher (faas-gpu's sandbox sets its death signal before it starts
the watchdog, and the replica's PID namespace ends with it), so it need not know the stack's pid."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable

from .logs import log

PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)  # Linux; looked up before any fork


def _set_death_signal() -> None:
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_watchdog(watchdog_pid: int):
    """A `preexec_fn`: the child gets SIGKILL when the watchdog dies, even by kill -9, so no
    handler is left reparented to PID 1 holding its port (the thread that forks must outlive
    the child: the main thread for the http child, the request's thread for a per-request one)."""

    def set_death_signal() -> None:
        _set_death_signal()
        if os.getppid() != watchdog_pid:  # it died before the prctl took effect
            os._exit(1)

    return set_death_signal


class HttpChild:
    """http mode's function process: `fprocess` forked once, its stdout and stderr logged line by
    line (prefixed unless `prefix_logs` is false); if it exits while `accepting()`, so does the
    watchdog, with its exit code."""

    def __init__(self, fprocess: str, prefix_logs: bool, accepting: Callable[[], bool]):
        self.fprocess, self.prefix_logs, self.accepting = fprocess, prefix_logs, accepting
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            shlex.split(self.fprocess),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_watchdog(os.getpid()),  # noqa: PLW1509 — only prctl runs there
        )
        for stream, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            threading.Thread(target=self._pipe, args=(stream, name), daemon=True).start()
        threading.Thread(target=self._wait, daemon=True).start()

    def stop(self) -> None:
        """Terminate it (killed after 5 s) once the watchdog has stopped serving."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _pipe(self, stream, name: str) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            log(f"{name}: {line}" if self.prefix_logs else line)

    def _wait(self) -> None:
        code = self.proc.wait()
        if self.accepting():
            log(f"Forked function has terminated: exit code {code}")
            os._exit(code or 1)
