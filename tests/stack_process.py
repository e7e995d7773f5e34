"""A real faas-gpu stack process for tests: gunicorn on free loopback ports, its own state folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from faas_gpu.paths import REPO_ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StackProcess:
    def __init__(self, home: Path, *extra_args: str):
        self.home = home
        self.gateway_port = free_port()
        self.provider_port = free_port()
        self.metrics_port = free_port()
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.log_path = home / "stack-test.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def provider_url(self) -> str:
        return f"http://127.0.0.1:{self.provider_port}"

    @property
    def metrics_url(self) -> str:
        """The gateway's metrics port (CE's :8082)."""
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def auth(self) -> tuple[str, str]:
        secrets = self.home / "secrets"
        return (
            (secrets / "basic-auth-user").read_text().strip(),
            (secrets / "basic-auth-password").read_text().strip(),
        )

    def start(self, timeout_s: float = 60) -> StackProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        env = {**os.environ, "FAAS_GPU_HOME": str(self.home)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "provider.server",
                "--home",
                str(self.home),
                "--gateway-port",
                str(self.gateway_port),
                "--provider-port",
                str(self.provider_port),
                "--metrics-port",
                str(self.metrics_port),
                *self.extra_args,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stack exited at start:\n{self.log_path.read_text()[-4000:]}")
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"stack did not start:\n{self.log_path.read_text()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(45)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def wait_ready(self, name: str, timeout_s: float = 60, replicas: int = 1) -> dict:
        deadline = time.monotonic() + timeout_s
        status: dict = {}
        while time.monotonic() < deadline:
            r = requests.get(f"{self.url}/system/function/{name}", auth=self.auth, timeout=5)
            if r.status_code == 200:
                status = r.json()
                if status["availableReplicas"] >= replicas:
                    return status
            time.sleep(0.1)
        raise AssertionError(f"{name} not ready: {status}\n{self.log_path.read_text()[-3000:]}")
