"""The Docker runtime's tests: a stack (`provider.server --runtime docker`) inside a test host's
network namespace, beside that host's dockerd, and the functions' images built on that engine.

The engine is the session's `docker_host` (tests.docker_fixtures: a test host with its own
dockerd and faas-gpu/base:latest built from this checkout).

Why the stack runs in the namespace: containers run on the host network, which is the test
host's namespace; the provider reaches replicas at 127.0.0.1:<port> there, and the test reaches
the gateway through `host.call` (a thread that entered the namespace).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import requests
import yaml
from docker.errors import NotFound

from faas_gpu.build import docker_build
from faas_gpu.paths import REPO_ROOT
from faas_gpu.stack import load_stack
from tests.stack_process import StackProcess

BASE_IMAGE = "faas-gpu/base:latest"

HOG = '''"""Allocate (and touch) the number of MiB in the body."""


def handle(event, context):
    mib = int(event.body or b"0")
    block = bytearray(mib * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return f"held {mib} MiB"
'''


class NsStack(StackProcess):
    """A faas-gpu stack process inside `host`'s namespace (docker runtime, that host's engine):
    StackProcess started through `host.popen` and reached through `host.call`."""

    stop_wait_s = 60
    ready_timeout_s = 90  # a container replica: the engine starts it, the watchdog comes up

    def __init__(self, host, home: Path, *extra_args: str):
        # the ports are free here and the namespace has nothing else listening but the replicas
        super().__init__(home, "--runtime", "docker", "--docker-host", host.base_url, *extra_args)
        self.host = host
        self.session = requests.Session()

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return self.host.popen(argv, **kwargs)

    def send(self, method: str, url: str, **kwargs) -> requests.Response:
        return self.host.call(self.session.request, method, url, **kwargs)

    # -- HTTP from inside the namespace ---------------------------------------------------
    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def invoke(self, name: str, body: bytes | str = b"", **kwargs) -> requests.Response:
        return self.request("POST", f"/function/{name}", auth=None, data=body, **kwargs)

    def deploy(self, body: dict, method: str = "POST") -> None:
        """POST, or PUT then POST on 404 (faas-cli deploy's update)."""
        r = self.request(method, "/system/functions", json=body)
        if method == "PUT" and r.status_code == 404:
            r = self.request("POST", "/system/functions", json=body)
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

    def logs(self, name: str) -> list[dict]:
        r = self.get("/system/logs", params={"name": name, "follow": "false"})
        assert r.status_code == 200, (r.status_code, r.text)
        return [yaml.safe_load(line) for line in r.text.splitlines() if line.strip()]


def containers(host, name: str, *, running: bool = True) -> list:
    """The function's containers on the host's engine (listed again when one goes between the
    list and its inspect, as the SDK inspects each: a replica being replaced)."""
    for _ in range(20):
        try:
            return host.client.containers.list(all=not running, filters={"label": f"com.openfaas.function={name}"})
        except NotFound:
            time.sleep(0.1)
    raise AssertionError(f"{name}: its containers kept changing while listed")


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
