"""A replica as an operating-system process: start it, probe it, stop it, measure it, reap it.

Each replica is a launcher (`faas_gpu.sandbox.launcher`, which dies with the provider) leading its own
process group (`start_new_session`), with the watchdog under it in the replica's sandbox, so
stopping it reaches the function's children too; the pid files under `run/` let a restarted
provider kill what a crashed one left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from faas_gpu.sandbox.launcher import LAUNCHER, launcher_argv
from faas_gpu.sandbox.replica import Sandbox
from faas_gpu.sandbox.zygote import ZYGOTE_MODULE

from .base import watchdog_ready

if TYPE_CHECKING:
    from .forkserver import ForkedProcess


@dataclass
class Replica:
    id: str
    port: int
    proc: subprocess.Popen | ForkedProcess
    """Its launcher, or (forked by the fork server) its relay seen as a process."""
    run_dir: Path
    digest: str
    slot: str | None = None
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    stopping: bool = False
    cpus: frozenset[int] | None = None
    """The CPUs it is pinned to (`pins`); None: not pinned."""
    fork_later: bool = False
    """Exec'd only because the fork server was not ready (`forkserver.NotReady`): to be replaced
    by a forked replica once it is (`LocalRuntime`)."""
    superseded: bool = False
    """Replaced as a replica of an older version is, new first (`replicas.reconcile_count`)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def popen(box: Sandbox, run_dir: Path, port: int) -> subprocess.Popen:
    """The watchdog in its sandbox, through the launcher in its own session: its output piped (to
    the function's log), its pid and port written beside it (the pid for `reap_stale`; the port
    lets benchmarks reach it). The sandbox's description goes on the launcher's stdin (not its
    command line, which every user of the host may read)."""
    proc = subprocess.Popen(
        launcher_argv(),
        cwd="/",
        env={},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with proc.stdin:
            proc.stdin.write(box.encode())
    except BrokenPipeError:  # the launcher is gone: its exit status says so
        pass
    (run_dir / "pid").write_text(str(proc.pid))
    (run_dir / "port").write_text(str(port))
    return proc


def probe(r: Replica) -> bool:
    """Whether the watchdog answers `/_/ready` (it does once its function serves)."""
    return watchdog_ready("127.0.0.1", r.port)


def stop_all(replicas: list[Replica], timeout_s: float) -> None:
    for r in replicas:
        r.stopping = True
        # the watchdog alone: it drains its in-flight requests, then stops its own child
        try:
            r.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    for r in replicas:
        try:
            r.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(r.proc, signal.SIGKILL)
            r.proc.wait()
        signal_group(r.proc, signal.SIGKILL)  # children the watchdog left behind
        shutil.rmtree(r.run_dir, ignore_errors=True)


def reap_stale(run_root: Path) -> None:
    """Kill replicas a crashed provider left running (their pids are in run/)."""
    if not run_root.exists():
        return
    for pid_file in run_root.glob("*/*/pid"):
        try:
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if os.fsencode(LAUNCHER) in cmdline or b"fwatchdog" in cmdline or _is_relay(cmdline):
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
    shutil.rmtree(run_root, ignore_errors=True)


def _is_relay(cmdline: bytes) -> bool:
    """A fork server's relay (the server's own command line: `python -m faas_gpu.sandbox.zygote`)."""
    return ZYGOTE_MODULE.encode() in cmdline.split(b"\0")


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def rss_bytes(replicas: list[Replica]) -> int:
    """Resident memory of the replicas and every process under them."""
    rss = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for r in replicas:
        for pid in _process_tree(r.proc.pid):
            try:
                rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            except (OSError, IndexError, ValueError):
                pass
    return rss


def uss_bytes(pid: int) -> int:
    """Private memory (USS: Private_Clean + Private_Dirty + Private_Hugetlb of
    /proc/<pid>/smaps_rollup) of `pid` and every process under it: what the replica holds that no
    other process shares, what stopping it gives back."""
    total = 0
    for each in _process_tree(pid):
        try:
            text = Path(f"/proc/{each}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Private_"):
                total += int(line.split()[1]) * 1024
    return total


def cpu_seconds(replica: Replica) -> float:
    """CPU time (user + system) of the replica's processes alive now."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in _process_tree(replica.proc.pid):
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _process_tree(pid: int) -> list[int]:
    pids, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for c in children:
            pids.append(int(c))
            frontier.append(int(c))
    return pids
