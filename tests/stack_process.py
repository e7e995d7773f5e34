"""A real faas-gpu stack process for tests: gunicorn on free loopback ports, its own state folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import requests

from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port


class StackProcess:
    """The stack as a child process on this machine's loopback. Subclasses change where it runs
    through two seams: `popen` (how the process starts: e.g. inside a test host's network
    namespace) and `send` (how a request reaches it from there); the rest is shared."""

    stop_wait_s: float = 45
    """How long a stop waits for the stack's graceful exit before SIGKILL."""
    ready_timeout_s: float = 60
    """`wait_ready`'s default: how long a replica may take to become available."""

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

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "provider.server", "--home", str(self.home),
            "--gateway-port", str(self.gateway_port), "--provider-port", str(self.provider_port),
            "--metrics-port", str(self.metrics_port), *self.extra_args,
        ]  # fmt: skip

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """The seam for where the stack runs: here, a child process of the test."""
        return subprocess.Popen(argv, **kwargs)

    def send(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """The seam for how a request reaches the stack: here, straight over loopback."""
        return requests.request(method, url, **kwargs)

    def request(self, method: str, path: str, *, auth: object = "system", **kwargs: Any) -> requests.Response:
        """`method path` on the gateway, with the stack's admin credentials unless `auth` is given."""
        kwargs.setdefault("timeout", 60)
        return self.send(method, self.url + path, auth=self.auth if auth == "system" else auth, **kwargs)

    def start(self, timeout_s: float = 60) -> Self:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "FAAS_GPU_HOME": str(self.home)}
        with open(self.log_path, "ab") as log:
            self.proc = self.popen(
                self.argv(), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stack exited at start:\n{self.log_tail()}")
            try:
                if self.request("GET", "/healthz", auth=None, timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"stack did not start:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(self.stop_wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def wait_ready(self, name: str, timeout_s: float | None = None, replicas: int = 1) -> dict:
        deadline = time.monotonic() + (self.ready_timeout_s if timeout_s is None else timeout_s)
        status: dict = {}
        while time.monotonic() < deadline:
            r = self.request("GET", f"/system/function/{name}", timeout=5)
            if r.status_code == 200:
                status = r.json()
                if status["availableReplicas"] >= replicas:
                    return status
            time.sleep(0.1)
        raise AssertionError(f"{name} not ready: {status}\n{self.log_tail(3000)}")
