"""`faas-gpu up --runtime docker`: classify as a container of its image, on the GPU path.

The whole stack in one test host's namespace (GPU Manager on the cpu back end, the scheduler,
the gateway + provider), classify built with the template's Dockerfile on the host's engine
(`--build-arg BASE_IMAGE=faas-gpu/base:latest`, which has torch and faas-gpu's GPU client), its
replica a container on the host network that reaches the scheduler with its own scoped token.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from faas_gpu.ports import free_port
from tests.e2e.classify_project import classify_stack, write_project

from .conftest import BASE_IMAGE, containers

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _base_has_the_gpu_client(host) -> bool:
    try:
        host.client.containers.run(
            BASE_IMAGE, ["python", "-c", "import torch, faas_gpu.client"], network_mode="host", remove=True
        )
        return True
    except Exception:  # noqa: BLE001 — a base without torch or faas-gpu: the test cannot run here
        return False


def test_classify_runs_as_a_container_through_the_gpu_path(docker_host, tmp_path):
    host = docker_host
    if not _base_has_the_gpu_client(host):
        pytest.skip(f"{BASE_IMAGE} has no torch or faas-gpu (build it with `faas-gpu base-image`)")
    root = tmp_path / "project"
    root.mkdir()
    # the first call exports, uploads and loads the model (seconds, more on a busy machine)
    timeouts = {"exec_timeout": "180s", "write_timeout": "180s", "read_timeout": "180s"}
    write_project(root, classify_stack("faas-gpu/classify:latest", {"com.faas-gpu.slo-ms": "5000"}, timeouts))
    ports = {k: free_port() for k in ("gateway", "provider", "metrics", "manager", "scheduler")}
    env = {
        **os.environ,
        "FAAS_GPU_HOME": str(tmp_path / "home"),
        "FAAS_GPU_CONFIG": str(tmp_path / "config.yml"),
        "upstream_timeout": "180s",  # the gateway waits out the first call (the model loads)
    }

    def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "faas_gpu.cli", *args]
        return host.run(argv, check=False, cwd=root, env=env, timeout=timeout)

    up = cli(
        "up", "-f", "stack.yml", "--runtime", "docker", "--docker-host", host.base_url,
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
        "--gateway-port", str(ports["gateway"]), "--provider-port", str(ports["provider"]),
        "--metrics-port", str(ports["metrics"]), "--gpu-manager-port", str(ports["manager"]),
        "--scheduler-port", str(ports["scheduler"]), "--backend", "cpu", "--gpu-units", "2",
        "--unit-memory-mb", "256",
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        [c] = containers(host, "classify")
        env_of = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert f"http://127.0.0.1:{ports['scheduler']}" in env_of["FAAS_GPU_SCHEDULER_URL"]
        assert env_of["FAAS_GPU_TOKEN_FILE"] and "FAAS_GPU_TOKEN" not in env_of  # a file, not the env

        def invoke(seed: int) -> requests.Response:
            return requests.post(
                f"http://127.0.0.1:{ports['gateway']}/function/classify", json={"seed": seed}, timeout=200
            )

        def logs() -> str:
            secrets = tmp_path / "home" / "secrets"
            auth = tuple((secrets / f"basic-auth-{k}").read_text().strip() for k in ("user", "password"))
            r = requests.get(
                f"http://127.0.0.1:{ports['gateway']}/system/logs",
                params={"name": "classify", "follow": "false"},
                auth=auth,
                timeout=30,
            )
            return "\n".join(r.text.splitlines()[-40:])

        first = host.call(invoke, 1)
        assert first.status_code == 200, (first.text, host.call(logs))
        body = first.json()
        assert body["model"] == "resnet-mini" and body["batch"] == 1
        again = host.call(invoke, 1)
        assert again.status_code == 200 and again.json()["predictions"] == body["predictions"]
        # the model ran on the GPU path (the scheduler's units), not in the container
        assert any(k.lower().startswith("x-faas-gpu") for k in again.headers), dict(again.headers)
    finally:
        down = cli("down", timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not containers(host, "classify", running=False)
