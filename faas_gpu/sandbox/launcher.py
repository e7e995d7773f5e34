"""The launcher: the small process the provider runs per replica, `python -I -S <this file>`, the
replica's `Sandbox` on its stdin.

Why a process of its own: the provider runs threads, and namespaces are made by a process that
runs one (`replica.unshare_namespaces`). The launcher dies with the provider, opens the files the
replica could not open itself, makes the namespaces, forks the sandbox's first process (PID 1 of
the new PID namespace: `replica.enter`, then `execve` of the watchdog), relays signals to it and
exits as it exits. Without site (-S) or environment (-I), and importing only the standard library
and `faas_gpu.sandbox`'s `primitives` and `replica` (`tests/sandbox/test_replica.py` holds it so):
every replica's start waits for this interpreter's.

A process is known for a replica's launcher by its command line, which names this file
(`LAUNCHER`: what a restarted provider or `faas-gpu down` kills).
"""

from __future__ import annotations

import os
import select
import signal
import sys

if __name__ == "__main__":  # run by path under -I -S: the folder holding faas_gpu is not on sys.path
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from faas_gpu.sandbox import primitives as p  # noqa: E402
from faas_gpu.sandbox.primitives import SandboxError  # noqa: E402
from faas_gpu.sandbox.replica import Sandbox, enter, unshare_namespaces  # noqa: E402

LAUNCHER = os.path.abspath(__file__)
"""The launcher's script (this file): how a process is known for a replica's launcher by its
command line."""
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def launcher_argv() -> list[str]:
    """The launcher's command line: the stack's interpreter without site (-S) or environment
    (-I), this file; the `Sandbox` goes on its stdin."""
    return [sys.executable, "-I", "-S", LAUNCHER]


def open_files(sb: Sandbox) -> dict[int, int]:
    """Open `files` with the launcher's privileges and view of the host, before any wall is up
    (the sandbox's uid may not open them; its mount namespace may not have them): number -> fd."""
    opened = {}
    for number, path in sb.files.items():
        try:
            opened[number] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SandboxError(f"open {path}: {exc.strerror}") from None
    return opened


def _exec(sb: Sandbox, opened: dict[int, int]) -> None:
    """Become the program, the opened files at their numbers (inheritable; every other descriptor
    of the launcher's is close-on-exec)."""
    for number, fd in opened.items():
        if fd == number:
            os.set_inheritable(fd, True)
        else:
            os.dup2(fd, number)
    os.execve(sb.argv[0], sb.argv, sb.env)


def _child(sb: Sandbox, alive: int, opened: dict[int, int]) -> None:
    """PID 1 of the sandbox: build it, then become the program. `alive`: the read end of a pipe
    whose writer is the launcher, which may have died before the death signal was set."""
    try:
        enter(sb)
        if select.select([alive], [], [], 0)[0]:  # EOF: the launcher is gone
            os._exit(1)
        os.close(alive)
        _exec(sb, opened)
    except BaseException as exc:  # noqa: BLE001 — anything: say it on the function's log, exit
        os.write(2, f"faas-gpu sandbox: {exc}\n".encode(errors="replace"))
        os._exit(126)


def launch(sb: Sandbox) -> int:
    """Run `sb`: this process dies with `sb.parent`; with namespaces it forks the sandbox's first
    process, relays signals to it and exits as it exits; without, it becomes the program."""
    if sb.parent is not None:
        p.die_with_parent()
        if os.getppid() != sb.parent:  # the parent died before the death signal was set
            return 1
    opened = open_files(sb)
    if not sb.namespaces:
        os.chdir(sb.cwd)
        p.no_new_privs()
        _exec(sb, opened)
    unshare_namespaces(sb)
    alive, keep = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(keep)
        _child(sb, alive, opened)
    os.close(alive)
    for sig in RELAYED:
        signal.signal(sig, lambda signum, _frame: _relay(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            return 1
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def _relay(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def probe(sb: Sandbox, timeout_s: float = 30.0) -> str | None:
    """Run `sb` (a short program, e.g. `python -c pass`) through the launcher: None when it ran and
    exited 0, else why not (the launcher's words)."""
    import subprocess

    try:
        done = subprocess.run(launcher_argv(), input=sb.encode(), capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
    return said[-1].removeprefix("faas-gpu sandbox: ") if said else f"exit status {done.returncode}"


def main() -> int:
    raw = sys.stdin.buffer.read()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        return launch(Sandbox.decode(raw))
    except (SandboxError, OSError, ValueError, KeyError) as exc:
        os.write(2, f"faas-gpu sandbox: {exc}\n".encode(errors="replace"))
        return 126


if __name__ == "__main__":
    sys.exit(main())
