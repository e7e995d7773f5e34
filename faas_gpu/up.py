"""`faas-gpu up` / `down`: run the stack on embedded defaults, then build and deploy stack.yml.

Like `faasd install` + `faas-cli up`: the daemons run in the background (pid and log files in
the state folder) so that the command returns once the functions serve. Three daemons, started
in this order and stopped in the reverse one: the GPU Manager (cpu back end here), the
scheduler(s), and the stack (gateway + provider), whose replicas reach every scheduler. A
supervisor (`faas_gpu.supervise`) starts them and restarts any that dies; `down` stops it first.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from faas_gpu import paths, procs
from faas_gpu.supervise import Daemon, healthy, read_stack, running_pid, supervisor_pid, write_stack

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


def start_stack(home: Path, wanted: list[Daemon], timeout_s: float = 60) -> dict[str, int]:
    """Start the supervisor (which starts the daemons) unless one runs; wait until all serve.

    A running stack is recognised by the supervisor's pid file and live process, never by a
    health probe: a busy gateway is waited for, never started a second time."""
    home.mkdir(parents=True, exist_ok=True)
    sup = supervisor_pid(home)
    if sup is None:
        write_stack(home, wanted)
        log_path = home / "supervisor.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "faas_gpu.supervise", "--home", str(home)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=paths.REPO_ROOT,
            )
        sup = proc.pid
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
    sup = supervisor_pid(home)
    if sup is not None:
        procs.stop(sup, timeout_s)
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
        if pid is not None and any("fwatchdog" in a for a in procs.cmdline(pid)):
            procs.kill_group(pid)
    for extra in home.glob("scheduler-*.pid"):
        pid = procs.read_pid(extra)
        if pid is not None and procs.runs(pid, "scheduler", home):
            procs.stop(pid, 45)
        extra.unlink(missing_ok=True)
    return stopped


def daemons(args: argparse.Namespace) -> list[Daemon]:
    host = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
    store = ["--etcd", args.etcd] if args.etcd else []
    out = []
    stack_args = [
        "--bind",
        args.bind,
        "--gateway-port",
        str(args.gateway_port),
        "--provider-port",
        str(args.provider_port),
        *store,
    ]
    if args.redis:
        stack_args += ["--redis", args.redis]
    if not args.no_gpu:
        out.append(
            Daemon(
                "gpu-manager",
                "gpu_manager",
                (
                    "--port",
                    str(args.gpu_manager_port),
                    "--backend",
                    args.backend,
                    "--units",
                    str(args.gpu_units),
                    "--unit-memory-mb",
                    str(args.unit_memory_mb),
                    *store,
                ),
                f"http://{host}:{args.gpu_manager_port}/healthz",
            )
        )
        urls = []
        for i in range(args.schedulers):  # replicas: one leads, the others take over when it dies
            port = args.scheduler_port + i
            name = "scheduler" if i == 0 else f"scheduler-{i + 1}"
            out.append(Daemon(name, "scheduler", ("--port", str(port), *store), f"http://{host}:{port}/healthz"))
            urls.append(f"http://{host}:{port}")
        stack_args += ["--scheduler", ",".join(urls)]  # every replica: the GPU client fails over
    out.append(Daemon("faas-gpu", "provider.server", tuple(stack_args), f"http://{host}:{args.gateway_port}/healthz"))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="faas-gpu up", description=__doc__)
    p.add_argument("-f", "--yaml", help="stack file to build and deploy (default stack.yaml/stack.yml)")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--gateway-port", type=int, default=8080)
    p.add_argument("--provider-port", type=int, default=8081)
    p.add_argument("--gpu-manager-port", type=int, default=8090)
    p.add_argument("--scheduler-port", type=int, default=8091)
    p.add_argument(
        "--schedulers",
        type=int,
        default=1,
        help="scheduler replicas, on --scheduler-port and the ports after it (default 1)",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="GPU Manager back end (auto: the GPUs NVML finds, else emulated units on the CPU)",
    )
    p.add_argument("--gpu-units", type=int, default=2, help="emulated units of the cpu back end")
    p.add_argument("--unit-memory-mb", type=float, default=1024)
    p.add_argument("--no-gpu", action="store_true", help="no GPU Manager or scheduler: models run in the instances")
    p.add_argument("--etcd", help="etcd URL (default: embedded datastore)")
    p.add_argument("--redis", help="Redis URL for async invocations (default: embedded queue)")
    p.add_argument("--no-deploy", action="store_true", help="only start the stack")
    p.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the stack")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.schedulers < 1:
        parser.error("--schedulers: must be at least 1")
    home = paths.home()
    started = start_stack(home, daemons(args))
    host = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
    gateway_url = f"http://{host}:{args.gateway_port}"
    deployed: list[str] = []
    if not args.no_deploy:
        from faas_gpu.cli import up_deploy

        deployed = up_deploy(args.yaml, gateway_url)
    secrets = paths.secrets_dir()
    print(f"faas-gpu is serving (pids {', '.join(f'{n} {p}' for n, p in started.items())}; logs in {home})")
    print(f"  gateway:      {gateway_url}")
    print(f"  provider API: http://{host}:{args.provider_port}")
    if not args.no_gpu:
        scheduler_urls = ", ".join(f"http://{host}:{args.scheduler_port + i}" for i in range(args.schedulers))
        print(
            f"  GPU path:     scheduler {scheduler_urls}, "
            f"GPU Manager ({args.backend}) http://{host}:{args.gpu_manager_port}"
        )
    print(f"  credentials:  {secrets / 'basic-auth-user'} and {secrets / 'basic-auth-password'}")
    for name in deployed:
        print(f"  function:     {gateway_url}/function/{name}")
    print("Try: echo hello | .venv/bin/faas-gpu invoke echo    Stop: .venv/bin/faas-gpu down")
    if args.foreground:
        try:
            while supervisor_pid(home) is not None:
                time.sleep(1)
        except KeyboardInterrupt:
            down_main([])
    return 0


def down_main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="faas-gpu down", description="Stop the stack.").parse_args(argv)
    stopped = stop_stack(paths.home())
    print(f"faas-gpu stopped ({', '.join(stopped)})" if stopped else "faas-gpu was not running")
    return 0
