"""The Docker runtime's tests: a stack (`provider.server --runtime docker`) inside a test host's
network namespace, beside that host's dockerd, and the functions' images built on that engine.

The engine is the session's `docker_host` (tests.docker_fixtures: a test host with its own
dockerd and faas-gpu/base:latest built from this checkout).

Why the stack runs in the namespace: containers run on the host network, which is the test
host's namespace; the provider reaches replicas at 127.0.0.1:<port> there, and the test reaches
the gateway through `host.call` (a thread that entered the namespace).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from faas_gpu.build import docker_build
from faas_gpu.paths import REPO_ROOT
from faas_gpu.stack import load_stack
from tests.stack_process import free_port

BASE_IMAGE = "faas-gpu/base:latest"

HOG = '''"""Allocate (and touch) the number of MiB in the body."""


def handle(event, context):
    mib = int(event.body or b"0")
    block = bytearray(mib * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return f"held {mib} MiB"
'''


class NsStack:
    """A faas-gpu stack process inside `host`'s namespace (docker runtime, that host's engine)."""

    def __init__(self, host, home: Path, *extra_args: str):
        self.host = host
        self.home = home
        # the ports are free here and the namespace has nothing else listening but the replicas
        self.gateway_port, self.provider_port, self.metrics_port = free_port(), free_port(), free_port()
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.log_path = home / "stack-test.log"
        self.session = requests.Session()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def auth(self) -> tuple[str, str]:
        secrets = self.home / "secrets"
        return (
            (secrets / "basic-auth-user").read_text().strip(),
            (secrets / "basic-auth-password").read_text().strip(),
        )

    def start(self, timeout_s: float = 60) -> NsStack:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "FAAS_GPU_HOME": str(self.home)}
        argv = [
            sys.executable, "-m", "provider.server", "--home", str(self.home),
            "--gateway-port", str(self.gateway_port), "--provider-port", str(self.provider_port),
            "--metrics-port", str(self.metrics_port),
            "--runtime", "docker", "--docker-host", self.host.base_url, *self.extra_args,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = self.host.popen(
                argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stack exited at start:\n{self.log_tail()}")
            try:
                if self.get("/healthz", auth=None, timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
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
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    # -- HTTP from inside the namespace ---------------------------------------------------
    def request(self, method: str, path: str, *, auth: object = "system", **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 60)
        if auth == "system":
            auth = self.auth
        return self.host.call(self.session.request, method, self.url + path, auth=auth, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def invoke(self, name: str, body: bytes | str = b"", **kwargs) -> requests.Response:
        return self.request("POST", f"/function/{name}", auth=None, data=body, **kwargs)

    def deploy(self, body: dict, method: str = "POST") -> None:
        r = self.request(method, "/system/functions", json=body)
        assert r.status_code == 202, (r.status_code, r.text)

    def status(self, name: str) -> dict:
        r = self.get(f"/system/function/{name}")
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def wait_until(self, what: str, check, timeout_s: float = 60, every_s: float = 0.2):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(every_s)
        raise AssertionError(f"{what}: not within {timeout_s}s (last: {last})\n{self.log_tail()}")

    def wait_ready(self, name: str, replicas: int = 1, timeout_s: float = 90) -> dict:
        def ready():
            s = self.status(name)
            return s if s["availableReplicas"] >= replicas else None

        return self.wait_until(f"{name} ready with {replicas}", ready, timeout_s)

    def logs(self, name: str) -> list[dict]:
        r = self.get("/system/logs", params={"name": name, "follow": "false"})
        assert r.status_code == 200, (r.status_code, r.text)
        return [yaml.safe_load(line) for line in r.text.splitlines() if line.strip()]


def containers(host, name: str, *, running: bool = True) -> list:
    """The function's containers on the host's engine."""
    return host.client.containers.list(all=not running, filters={"label": f"com.openfaas.function={name}"})


def build_project(host, root: Path, functions: dict[str, dict]) -> None:
    """A project with the repo's echo and a memory hog, built with the template's Dockerfile on
    `host`'s engine (`faas-gpu build --docker` with --build-arg BASE_IMAGE), as a user builds."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO_ROOT / "functions" / "echo", root / "echo", dirs_exist_ok=True)
    (root / "hog").mkdir(exist_ok=True)
    (root / "hog" / "handler.py").write_text(HOG)
    (root / "hog" / "requirements.txt").write_text("")
    stack = {"version": 1.0, "provider": {"name": "openfaas"}, "functions": functions}
    (root / "stack.yml").write_text(yaml.safe_dump(stack))
    loaded = load_stack(root / "stack.yml")
    for spec in loaded.functions.values():
        docker_build(spec, stack_dir=root, build_args={"BASE_IMAGE": BASE_IMAGE}, docker_host=host.base_url)
