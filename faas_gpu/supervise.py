"""`python -m faas_gpu.supervise --home H`: keeps the stack's daemons running.

`faas-gpu up` writes the daemons to run (H/stack.json) and starts this supervisor, which starts
them in order (each once the previous one serves), restarts any that dies with back-off, and
keeps H/<name>.pid holding the pid that really runs. SIGTERM (`faas-gpu down`) stops them in the
reverse order and then the supervisor itself. A daemon already running for this state folder
(its pid file names a live process with its command line) is adopted, never started twice; so
is a supervisor: it holds H/supervisor.lock while it runs, and a second one exits at once.

The supervisor is supervised in turn (issue 42: after kill -9 of it nothing restarted it, and a
daemon killed later stayed down): each daemon it starts is told its state folder
(`FAAS_GPU_SUPERVISOR_HOME`) and runs `keep_supervisor`, which starts the supervisor again when
it is gone and the stack is still wanted (stack.json there, no H/stack.down, which `faas-gpu
down` writes first). The new supervisor adopts the daemons that run and restarts the others, so
every daemon comes back by itself after any sequence of kills that leaves one of them, or the
supervisor, running. Hosts that run the daemons outside containers without `faas-gpu up` give
that job to systemd (deploy/systemd/).

The callers' side lives here too (`start_stack`, `stop_stack`, `stack_pids`): how the
supervisor is found, started and stopped is one account, whichever command (`up`, `down`) asks.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from faas_gpu import paths, procs
from faas_gpu.contract.env import SUPERVISOR_HOME
from faas_gpu.paths import DOWN_FILE, LOCK_FILE, STACK_FILE
from faas_gpu.sandbox.launcher import LAUNCHER
from faas_gpu.sandbox.zygote import ZYGOTE_MODULE

log = logging.getLogger("faas-gpu.supervise")
MODULE = "faas_gpu.supervise"
MAX_BACKOFF_S = 30.0
HEALTHY_RESET_S = 30.0  # a daemon that ran this long since its start has its back-off forgotten
STOP_TIMEOUT_S = 45.0
CHECK_EVERY_S = 0.25
KEEP_EVERY_S = 1.0  # how often a daemon looks whether its supervisor still runs


@dataclass(frozen=True)
class Daemon:
    name: str  # pid and log files: <name>.pid, <name>.log
    module: str
    args: tuple[str, ...]
    health_url: str

    def argv(self, home: Path) -> list[str]:
        return [sys.executable, "-m", self.module, "--home", str(home), *self.args]


def _backoff(failures: int) -> float:
    return min(MAX_BACKOFF_S, 0.5 * 2 ** min(max(failures - 1, 0), 16))


def write_stack(home: Path, daemons: list[Daemon]) -> None:
    (home / STACK_FILE).write_text(json.dumps([asdict(d) for d in daemons], indent=1))


def read_stack(home: Path) -> list[Daemon]:
    return [
        Daemon(d["name"], d["module"], tuple(d["args"]), d["health_url"])
        for d in json.loads((home / STACK_FILE).read_text())
    ]


def pid_file(home: Path, name: str) -> Path:
    return home / f"{name}.pid"


def write_pid(home: Path, name: str, pid: int) -> None:
    """Whole or not at all (a file renamed into place): the daemons, `down` and the tests read
    these files while a supervisor writes them, and an empty one reads as no supervisor."""
    tmp = home / f".{name}.pid.{os.getpid()}"
    tmp.write_text(str(pid))
    os.replace(tmp, pid_file(home, name))


def running_pid(home: Path, d: Daemon) -> int | None:
    """The daemon's pid when its pid file names a live process that runs it for this home."""
    pid = procs.read_pid(pid_file(home, d.name))
    return pid if pid is not None and procs.runs(pid, d.module, home) else None


def find_running(home: Path, d: Daemon) -> int | None:
    """The daemon's pid from its pid file or, when that lies, from the live command lines
    (the same module, home and arguments): a daemon that runs is adopted, never started twice."""
    pid = running_pid(home, d)
    if pid is not None:
        return pid
    for other in procs.find(d.module, home):
        if procs.cmdline(other)[1:] == d.argv(home)[1:]:
            write_pid(home, d.name, other)
            return other
    return None


def supervisor_pid(home: Path) -> int | None:
    pid = procs.read_pid(pid_file(home, "supervisor"))
    return pid if pid is not None and procs.runs(pid, MODULE, home) else None


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        return requests.get(url, timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


@dataclass
class _Running:
    daemon: Daemon
    pid: int | None = None
    proc: subprocess.Popen | None = None  # None for an adopted daemon (not our child)
    started: float = 0.0
    failures: int = 0
    next_start: float = 0.0
    restarts: list[float] = field(default_factory=list)

    def alive(self) -> bool:
        if self.pid is None:
            return False
        if self.proc is not None:
            return self.proc.poll() is None
        return procs.alive(self.pid)


class Supervisor:
    def __init__(self, home: Path, daemons: list[Daemon]):
        self.home = home
        self.daemons = [_Running(d) for d in daemons]
        self.stopping = threading.Event()

    def run(self) -> None:
        for r in self.daemons:  # in order: each once the one before serves (or gave up trying)
            if self.stopping.is_set() or not stack_wanted(self.home):
                break
            pid = find_running(self.home, r.daemon)
            if pid is not None:
                r.pid, r.started = pid, time.monotonic()
                log.info("%s already runs (pid %d): adopted", r.daemon.name, pid)
            else:
                self._start(r)
            self._wait_healthy(r, 60.0)
        while not self.stopping.wait(CHECK_EVERY_S):
            if not stack_wanted(self.home):  # `faas-gpu down` began while this one was starting
                log.info("the stack of %s is being taken down; stopping", self.home)
                break
            for r in self.daemons:
                try:
                    self._check(r, time.monotonic())
                except Exception:  # the supervisor outlives any one daemon's trouble
                    log.exception("supervising %s failed; trying again", r.daemon.name)
                    r.failures += 1
                    r.next_start = time.monotonic() + _backoff(r.failures)
        self._stop_all()

    def _check(self, r: _Running, now: float) -> None:
        if r.alive():
            if r.failures and now - r.started >= HEALTHY_RESET_S:
                r.failures = 0
            return
        if r.pid is not None:
            code = r.proc.returncode if r.proc is not None else None
            log.warning("%s (pid %d) died (exit %s); restarting", r.daemon.name, r.pid, code)
            procs.kill_group(r.pid)  # what it left behind in its group (workers)
            r.pid, r.proc = None, None
            r.failures += 1
            r.next_start = now + _backoff(r.failures)
        if now >= r.next_start and not self.stopping.is_set():
            self._start(r)

    def _start(self, r: _Running) -> None:
        d = r.daemon
        with open(self.home / f"{d.name}.log", "ab") as out:
            try:
                proc = subprocess.Popen(
                    d.argv(self.home),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own group: stopped with whatever it started
                    cwd=paths.REPO_ROOT,
                    env={**os.environ, SUPERVISOR_HOME.name: str(self.home)},  # it restarts this supervisor
                )
            except OSError as exc:
                log.error("cannot start %s: %s", d.name, exc)
                r.failures += 1
                r.next_start = time.monotonic() + _backoff(r.failures)
                return
        r.pid, r.proc, r.started = proc.pid, proc, time.monotonic()
        write_pid(self.home, d.name, proc.pid)
        log.info("started %s (pid %d)", d.name, proc.pid)

    def _wait_healthy(self, r: _Running, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping.is_set() and r.alive():
            if healthy(r.daemon.health_url):
                return
            self.stopping.wait(0.2)

    def _stop_all(self) -> None:
        for r in reversed(self.daemons):
            if r.pid is None:
                continue
            log.info("stopping %s (pid %d)", r.daemon.name, r.pid)
            procs.stop(r.pid, STOP_TIMEOUT_S)
            if r.proc is not None:
                r.proc.wait()
            pid_file(self.home, r.daemon.name).unlink(missing_ok=True)


# -- the supervisor's callers: `faas-gpu up` starts it, `faas-gpu down` stops it --------------
DAEMON_NAMES = ("faas-gpu", "scheduler", "gpu-manager")  # the order they stop in
MODULES = {"faas-gpu": "provider.server", "scheduler": "scheduler", "gpu-manager": "gpu_manager"}


def stack_pids(home: Path) -> dict[str, int]:
    """The daemons running for `home`, by name (pid files checked against live command lines)."""
    out = {}
    try:
        stack = read_stack(home)
    except (OSError, ValueError, KeyError):
        stack = []
    for d in stack:
        pid = running_pid(home, d)
        if pid is not None:
            out[d.name] = pid
    return out


def spawn_supervisor(home: Path) -> int:
    """A supervisor for `home`, in a session of its own (it outlives whoever started it); its pid."""
    with open(home / "supervisor.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, "--home", str(home)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=paths.REPO_ROOT,
        )
    return proc.pid


def stack_wanted(home: Path) -> bool:
    """The stack of `home` is meant to run: `up` wrote it and `down` has not been asked since."""
    return (home / STACK_FILE).exists() and not (home / DOWN_FILE).exists()


def keep_supervisor(home: Path, stop: threading.Event, every_s: float = KEEP_EVERY_S) -> None:
    """A daemon's side of supervision: start the supervisor of `home` again whenever it is gone
    while the stack is wanted (several daemons may try at once: the supervisor's lock keeps one)."""
    while not stop.wait(every_s):
        try:
            if stack_wanted(home) and supervisor_pid(home) is None:
                pid = spawn_supervisor(home)
                log.warning("the supervisor of %s was not running; started it again (pid %d)", home, pid)
                deadline = time.monotonic() + 10
                while supervisor_pid(home) is None and procs.alive(pid) and time.monotonic() < deadline:
                    stop.wait(0.1)  # its pid file, before anyone looks again
        except Exception:  # a full disk, a vanished folder: try again next round
            log.exception("keeping the supervisor of %s running failed", home)


def keep_supervisor_from_env() -> threading.Event | None:
    """In a daemon the supervisor started (`FAAS_GPU_SUPERVISOR_HOME`): `keep_supervisor` on a
    thread of its own; the event stops it. None elsewhere (containers, systemd, tests)."""
    home = SUPERVISOR_HOME.read()
    if home is None:
        return None
    stop = threading.Event()
    threading.Thread(target=keep_supervisor, args=(Path(home), stop), name="keep-supervisor", daemon=True).start()
    return stop


def start_stack(home: Path, wanted: list[Daemon], timeout_s: float = 60) -> dict[str, int]:
    """Start the supervisor (which starts the daemons) unless one runs; wait until all serve.

    A running stack is recognised by the supervisor's pid file and live process, never by a
    health probe: a busy gateway is waited for, never started a second time."""
    home.mkdir(parents=True, exist_ok=True)
    (home / DOWN_FILE).unlink(missing_ok=True)  # wanted again: its daemons may restart its supervisor
    sup = supervisor_pid(home)
    if sup is None:
        write_stack(home, wanted)
        sup = spawn_supervisor(home)
    else:
        running = read_stack(home)
        if [d.name for d in running] != [d.name for d in wanted] or running != wanted:
            print(f"faas-gpu: a stack already runs for {home} (supervisor pid {sup}); using it as it is")
        wanted = running
    for d in wanted:
        deadline = time.monotonic() + timeout_s
        while not (running_pid(home, d) is not None and healthy(d.health_url)):
            if not procs.alive(sup):
                raise SystemExit(f"faas-gpu: the supervisor exited; see {home / 'supervisor.log'}")
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"faas-gpu: {d.name} did not serve {d.health_url} within {timeout_s:.0f}s "
                    f"(it is restarted with back-off meanwhile); see {home / (d.name + '.log')}"
                )
            time.sleep(0.2)
    return stack_pids(home)


def stop_stack(home: Path, timeout_s: float = 120) -> list[str]:
    """Stop the supervisor first (it stops its daemons in order), then whatever still runs for
    this home: daemons found by command line (a pid file may be stale) and replicas in run/."""
    stopped = []
    if home.is_dir():  # first: no daemon being stopped starts the supervisor again
        (home / DOWN_FILE).write_text("faas-gpu down\n")
    sup = supervisor_pid(home)
    # and one a daemon started just before the stack was marked down (it stops at once)
    for pid in dict.fromkeys([*([sup] if sup is not None else []), *procs.find(MODULE, home)]):
        procs.stop(pid, timeout_s)
        if "supervisor" not in stopped:
            stopped.append("supervisor")
    (home / "supervisor.pid").unlink(missing_ok=True)
    for name in DAEMON_NAMES:
        pids = set(procs.find(MODULES[name], home))
        pid = procs.read_pid(home / f"{name}.pid")
        if pid is not None and procs.runs(pid, MODULES[name], home):
            pids.add(pid)
        for other in sorted(pids):
            procs.stop(other, 45)
        (home / f"{name}.pid").unlink(missing_ok=True)
        if pids and name not in stopped:
            stopped.append(name)
    for pid_path in (home / "run").glob("*/*/pid"):
        pid = procs.read_pid(pid_path)
        if pid is not None and any("fwatchdog" in a or a in (LAUNCHER, ZYGOTE_MODULE) for a in procs.cmdline(pid)):
            procs.kill_group(pid)
    for extra in home.glob("scheduler-*.pid"):
        pid = procs.read_pid(extra)
        if pid is not None and procs.runs(pid, "scheduler", home):
            procs.stop(pid, 45)
        extra.unlink(missing_ok=True)
    return stopped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="faas-gpu supervise", description=__doc__)
    p.add_argument("--home", type=Path, required=True)
    args = p.parse_args(argv)
    home = args.home.resolve()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lock = open(home / LOCK_FILE, "a+")  # noqa: SIM115 — held (and kept open) for the supervisor's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # several daemons found it gone at once: one of them started the supervisor
        log.info("a supervisor already runs for %s", home)
        return 0
    other = supervisor_pid(home)
    if other is not None and other != os.getpid():
        log.info("a supervisor already runs for %s (pid %d)", home, other)
        return 0
    if not stack_wanted(home):  # started by a daemon just as `faas-gpu down` began
        log.info("the stack of %s is down; not starting it", home)
        return 0
    write_pid(home, "supervisor", os.getpid())
    sup = Supervisor(home, read_stack(home))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sup.stopping.set())
    try:
        sup.run()
    finally:
        if procs.read_pid(pid_file(home, "supervisor")) == os.getpid():
            pid_file(home, "supervisor").unlink(missing_ok=True)
    log.info("supervisor stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
