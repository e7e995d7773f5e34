"""The watchdog's log lines: stdout, timestamped as of-watchdog's Go logger writes them; and, for
a function served in this process, its stdout and stderr logged as http mode logs its child's."""

from __future__ import annotations

import os
import sys
import threading
import time

_fd = 1  # where log lines go: the process's stdout, or a copy of it once `capture` took fd 1


def log(msg: str) -> None:
    line = (time.strftime("%Y/%m/%d %H:%M:%S ") + msg + "\n").encode("utf-8", "replace")
    if _fd == 1:
        sys.stdout.flush()
    while line:
        line = line[os.write(_fd, line) :]


class Captured:
    """fds 1 and 2 turned into pipes whose lines are logged (`stdout: `/`stderr: ` first unless
    `prefix_logs` is false). At the descriptor level, so what native code (torch, CUDA) writes is
    logged the same as Python's prints, as it is from http mode's child."""

    def __init__(self, prefix_logs: bool):
        global _fd
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {1: os.dup(1), 2: os.dup(2)}
        self._pumps: list[threading.Thread] = []
        _fd = self._saved[1]
        for fd, name in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            pump = threading.Thread(target=self._pump, args=(r, f"{name}: " if prefix_logs else ""), daemon=True)
            pump.start()
            self._pumps.append(pump)

    @staticmethod
    def _pump(r: int, prefix: str) -> None:
        with os.fdopen(r, "rb") as stream:
            for raw in stream:
                log(prefix + raw.decode("utf-8", "replace").rstrip("\n"))

    def release(self, wait_s: float = 2.0) -> None:
        """fds 1 and 2 back as they were, after what was written to the pipes has been logged."""
        global _fd
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # the pipe's last write end closes: its pump reads to the end
        for pump in self._pumps:
            pump.join(wait_s)
        _fd = 1
        for saved in self._saved.values():
            os.close(saved)
