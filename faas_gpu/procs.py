"""Processes that live and die together: a child's death signal, and telling our daemons apart.

A pid file alone is no proof: the pid may be dead, or reused by another program. A process is
one of ours when it is alive (not a zombie) and its command line names the daemon's module and
the stack's state folder.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from faas_gpu.sandbox import primitives


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """Ask Linux to send `sig` to this process when its parent dies (even by kill -9).

    Called in the child (a `preexec_fn`, gunicorn's post_fork, a multiprocessing target).
    The signal fires when the *thread* that created the child exits, so the creator must be a
    long-lived thread. When `parent_pid` is given and the parent is already gone (it died
    before the prctl), the child exits at once."""
    primitives.die_with_parent(sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def runs(pid: int, module: str, home: Path) -> bool:
    """Is `pid` alive and `python -m <module> --home <home> ...`?"""
    argv = cmdline(pid)
    if not alive(pid) or not argv:
        return False
    return _has_pair(argv, "-m", module) and _has_pair(argv, "--home", str(home))


def find(module: str, home: Path) -> list[int]:
    """Every live `python -m <module> --home <home>` on this machine (pid files can lie), less
    the children that share the command line (gunicorn's worker is stopped with its master)."""
    found = {int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and runs(int(e.name), module, home)}
    return sorted(pid for pid in found if _ppid(pid) not in found)  # a gunicorn worker is its master's


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def stop(pid: int, timeout_s: float, sig: int = signal.SIGTERM) -> None:
    """SIGTERM the process, wait, then SIGKILL its whole process group (it leads one)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_group(pid)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _has_pair(argv: list[str], flag: str, value: str) -> bool:
    return any(a == flag and b == value for a, b in zip(argv, argv[1:], strict=False)) or f"{flag}={value}" in argv
