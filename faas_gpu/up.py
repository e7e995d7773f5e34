"""`faas-gpu up` / `down`: run the stack on embedded defaults, then build and deploy stack.yml.

Like `faasd install` + `faas-cli up`: the daemons run in the background (pid and log files in
the state folder) so that the command returns once the functions serve. Three daemons, started
in this order and stopped in the reverse one: the GPU Manager (cpu back end here), the
scheduler, and the stack (gateway + provider), whose replicas reach the scheduler.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from faas_gpu import paths


@dataclass(frozen=True)
class Daemon:
    name: str  # pid and log files: <name>.pid, <name>.log
    module: str
    args: tuple[str, ...]
    health_url: str


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _read_pid(home: Path, name: str) -> int | None:
    try:
        pid = int((home / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def start_daemon(home: Path, d: Daemon, timeout_s: float = 60) -> int:
    """Start a daemon in the background unless it already serves; returns its pid."""
    pid = _read_pid(home, d.name)
    if pid is not None and _healthy(d.health_url):
        return pid
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / f"{d.name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 — handed to the daemon
    proc = subprocess.Popen(
        [sys.executable, "-m", d.module, "--home", str(home), *d.args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=paths.REPO_ROOT,
    )
    (home / f"{d.name}.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"faas-gpu: {d.name} exited at start-up; see {log_path}")
        if _healthy(d.health_url):
            return proc.pid
        time.sleep(0.2)
    raise SystemExit(f"faas-gpu: {d.name} did not serve within {timeout_s:.0f}s; see {log_path}")


def stop_daemon(home: Path, name: str, timeout_s: float = 45) -> bool:
    pid = _read_pid(home, name)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    (home / f"{name}.pid").unlink(missing_ok=True)
    return True


DAEMON_NAMES = ("faas-gpu", "scheduler", "gpu-manager")  # the order they stop in


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
        out.append(
            Daemon(
                "scheduler",
                "scheduler",
                ("--port", str(args.scheduler_port), *store),
                f"http://{host}:{args.scheduler_port}/healthz",
            )
        )
        stack_args += ["--scheduler", f"http://{host}:{args.scheduler_port}"]
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
    args = _parser().parse_args(argv)
    home = paths.home()
    started = {d.name: start_daemon(home, d) for d in daemons(args)}
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
        print(
            f"  GPU path:     scheduler http://{host}:{args.scheduler_port}, "
            f"GPU Manager ({args.backend}) http://{host}:{args.gpu_manager_port}"
        )
    print(f"  credentials:  {secrets / 'basic-auth-user'} and {secrets / 'basic-auth-password'}")
    for name in deployed:
        print(f"  function:     {gateway_url}/function/{name}")
    print("Try: echo hello | .venv/bin/faas-gpu invoke echo    Stop: .venv/bin/faas-gpu down")
    if args.foreground:
        try:
            while _alive(started["faas-gpu"]):
                time.sleep(1)
        except KeyboardInterrupt:
            down_main([])
    return 0


def down_main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="faas-gpu down", description="Stop the stack.").parse_args(argv)
    stopped = [name for name in DAEMON_NAMES if stop_daemon(paths.home(), name)]
    print(f"faas-gpu stopped ({', '.join(stopped)})" if stopped else "faas-gpu was not running")
    return 0
