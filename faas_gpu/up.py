"""`faas-gpu up` / `down`: run the stack on embedded defaults, then build and deploy stack.yml.

Like `faasd install` + `faas-cli up`: the stack runs as a background daemon (pid and log in
the state folder) so that the command returns once the functions serve.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from faas_gpu import paths

PID_FILE = "faas-gpu.pid"
LOG_FILE = "faas-gpu.log"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _read_pid(home: Path) -> int | None:
    try:
        pid = int((home / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def start_daemon(home: Path, server_args: list[str], gateway_url: str, timeout_s: float = 60) -> int:
    """Start the stack in the background unless it already serves; returns its pid."""
    pid = _read_pid(home)
    if pid is not None and _healthy(gateway_url):
        return pid
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / LOG_FILE, "ab")  # noqa: SIM115 — handed to the daemon
    proc = subprocess.Popen(
        [sys.executable, "-m", "provider.server", "--home", str(home), *server_args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=paths.REPO_ROOT,
    )
    (home / PID_FILE).write_text(str(proc.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"faas-gpu: the stack exited at start-up; see {home / LOG_FILE}")
        if _healthy(gateway_url):
            return proc.pid
        time.sleep(0.2)
    raise SystemExit(f"faas-gpu: the stack did not serve within {timeout_s:.0f}s; see {home / LOG_FILE}")


def stop_daemon(home: Path, timeout_s: float = 45) -> bool:
    pid = _read_pid(home)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    (home / PID_FILE).unlink(missing_ok=True)
    return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="faas-gpu up", description=__doc__)
    p.add_argument("-f", "--yaml", help="stack file to build and deploy (default stack.yaml/stack.yml)")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--gateway-port", type=int, default=8080)
    p.add_argument("--provider-port", type=int, default=8081)
    p.add_argument("--etcd", help="etcd URL (default: embedded datastore)")
    p.add_argument("--redis", help="Redis URL for async invocations (default: embedded queue)")
    p.add_argument("--no-deploy", action="store_true", help="only start the stack")
    p.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the stack")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    home = paths.home()
    host = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
    gateway_url = f"http://{host}:{args.gateway_port}"
    server_args = [
        "--bind",
        args.bind,
        "--gateway-port",
        str(args.gateway_port),
        "--provider-port",
        str(args.provider_port),
    ]
    if args.etcd:
        server_args += ["--etcd", args.etcd]
    if args.redis:
        server_args += ["--redis", args.redis]
    pid = start_daemon(home, server_args, gateway_url)
    deployed: list[str] = []
    if not args.no_deploy:
        from faas_gpu.cli import up_deploy

        deployed = up_deploy(args.yaml, gateway_url)
    secrets = paths.secrets_dir()
    print(f"faas-gpu is serving (pid {pid}, log {home / LOG_FILE})")
    print(f"  gateway:      {gateway_url}")
    print(f"  provider API: http://{host}:{args.provider_port}")
    print(f"  credentials:  {secrets / 'basic-auth-user'} and {secrets / 'basic-auth-password'}")
    for name in deployed:
        print(f"  function:     {gateway_url}/function/{name}")
    print("Try: echo hello | .venv/bin/faas-gpu invoke echo    Stop: .venv/bin/faas-gpu down")
    if args.foreground:
        try:
            while _alive(pid):
                time.sleep(1)
        except KeyboardInterrupt:
            stop_daemon(home)
    return 0


def down_main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="faas-gpu down", description="Stop the stack.").parse_args(argv)
    stopped = stop_daemon(paths.home())
    print("faas-gpu stopped" if stopped else "faas-gpu was not running")
    return 0
