"""The real faas-cli and the real OpenFaaS gateway against our stack.

Neither ships through a package registry, so these run only where binaries are given:
`FAAS_CLI=/path/to/faas-cli` (0.18.x; 0.16.x too) and `OPENFAAS_GATEWAY=/path/to/gateway` (0.27.x, which
binds :8080 and :8082 itself, so that test needs both ports free). Without them they skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from tests.stack_process import StackProcess

FAAS_CLI = os.environ.get("FAAS_CLI")
GATEWAY = os.environ.get("OPENFAAS_GATEWAY")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def project(tmp_path):
    env = {**os.environ, "FAAS_GPU_HOME": str(tmp_path / "home"), "OPENFAAS_CONFIG": str(tmp_path / "ofcfg")}
    env.pop("OPENFAAS_URL", None)

    def run(*args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:  # noqa: A002
        cmd = [FAAS_CLI, *args] if args[0] != "faas-gpu" else [sys.executable, "-m", "faas_gpu.cli", *args[1:]]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, input=input, capture_output=True, timeout=120)
        if check:
            assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
        return proc

    return tmp_path, run


@pytest.mark.skipif(not FAAS_CLI, reason="set FAAS_CLI to a faas-cli 0.18 binary")
def test_real_faas_cli_drives_the_stack(project):
    root, run = project
    stack = StackProcess(root / "home").start()
    gw = ["-g", stack.url]
    try:
        run("faas-gpu", "template", "pull")
        run("new", "myfn", "--lang", "python3-gpu")
        # faas-cli 0.17+ writes stack.yaml; 0.16 wrote myfn.yml
        stack_file = next(p for p in ("stack.yaml", "stack.yml", "myfn.yml") if (root / p).is_file())
        (root / stack_file).write_text((root / stack_file).read_text().replace("127.0.0.1:8080", stack.url[7:]))
        run("build", "--shrinkwrap", "-f", stack_file)
        assert (root / "build" / "myfn" / "function" / "handler.py").is_file()
        run("faas-gpu", "build", "-f", stack_file)
        run("login", *gw, "-u", "admin", "--password-stdin", input=stack.auth[1].encode())
        run("deploy", "-f", stack_file)
        stack.wait_ready("myfn")
        assert b"myfn" in run("list", *gw).stdout
        assert b"Status:             Ready" in run("describe", "myfn", *gw).stdout
        assert b"Hello from python3-gpu" in run("invoke", "myfn", *gw, input=b"hi").stdout
        logs = run("logs", "myfn", *gw, "--tail=false", "--lines=5").stdout
        assert b"Listening on port" in logs
        run("secret", "create", "tok", *gw, input=b"s3cr3t")
        assert b"tok" in run("secret", "list", *gw).stdout
        run("secret", "remove", "tok", *gw)
        assert b"faas-gpu" in run("version", *gw, "--warn-update=false").stdout
        run("remove", "myfn", *gw)
        assert run("remove", "myfn", *gw, check=False).returncode != 0
    finally:
        stack.stop()


@pytest.mark.skipif(not GATEWAY, reason="set OPENFAAS_GATEWAY to an OpenFaaS gateway 0.27 binary")
def test_real_openfaas_gateway_in_front_of_the_provider(tmp_path):
    if not (_port_free(8080) and _port_free(8082)):
        pytest.skip("the OpenFaaS gateway needs ports 8080 and 8082 free")
    stack = StackProcess(tmp_path / "home").start()
    env = {
        **os.environ,
        "functions_provider_url": f"{stack.provider_url}/",
        "faas_prometheus_host": "127.0.0.1",
        "faas_prometheus_port": str(stack.provider_port),
        "basic_auth": "true",
        "secret_mount_path": f"{stack.home / 'secrets'}/",
        "scale_from_zero": "true",
    }
    gw = subprocess.Popen(
        [GATEWAY], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = "http://127.0.0.1:8080"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        body = {"service": "cat", "image": "x", "envProcess": "cat"}
        assert requests.post(f"{url}/system/functions", json=body, auth=stack.auth, timeout=10).status_code == 202
        stack.wait_ready("cat")
        listed = requests.get(f"{url}/system/functions", auth=stack.auth, timeout=10)
        assert listed.status_code == 200 and [f["name"] for f in listed.json()] == ["cat"]
        assert requests.post(f"{url}/function/cat", data=b"via openfaas", timeout=10).content == b"via openfaas"
        r = requests.post(
            f"{url}/system/scale-function/cat", json={"serviceName": "cat", "replicas": 2}, auth=stack.auth, timeout=10
        )
        assert r.status_code == 202
        assert stack.wait_ready("cat", replicas=2)["replicas"] == 2
        counted = requests.get(f"{url}/system/functions", auth=stack.auth, timeout=10).json()[0]
        assert counted["invocationCount"] == 1  # from our answer to the gateway's Prometheus query
        _same_gateway_answers(url, stack)
    finally:
        os.killpg(gw.pid, signal.SIGTERM)
        gw.wait(10)
        stack.stop()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)


def _same_gateway_answers(ce_url: str, stack: StackProcess) -> None:
    """Where faas-gpu's gateway routes copy the CE gateway, both answer alike (in front of one provider)."""

    def replicas() -> int:
        return requests.get(f"{stack.url}/system/function/cat", auth=stack.auth, timeout=10).json()["replicas"]

    for base in (ce_url, stack.url):
        r = requests.post(f"{base}/system/scale-function/cat", json={"replicas": 0}, auth=stack.auth, timeout=10)
        assert r.status_code == 202 and replicas() == 1, base  # 0 becomes the minimum
        r = requests.post(f"{base}/system/scale-function/cat", json={"replicas": 50}, auth=stack.auth, timeout=10)
        assert r.status_code == 202 and replicas() == 5, base  # CE's maximum without a label
        r = requests.get(f"{base}/system/logs", params={"name": "no-such-fn"}, auth=stack.auth, timeout=10)
        assert (r.status_code, r.content) == (501, b""), base
        alert = {"status": "resolved", "alerts": [{"status": "resolved", "labels": {"function_name": "cat"}}]}
        r = requests.post(f"{base}/system/alert", json=alert, auth=stack.auth, timeout=10)
        assert r.status_code == 200 and replicas() == 1, base
        ghost = {"alerts": [{"status": "firing", "labels": {"function_name": "no-such-fn"}}]}
        assert requests.post(f"{base}/system/alert", json=ghost, auth=stack.auth, timeout=10).status_code == 200
        assert requests.post(f"{base}/system/alert", json={"alerts": 5}, auth=stack.auth, timeout=10).status_code == 400
    ce_info = requests.get(f"{ce_url}/system/info", auth=stack.auth, timeout=10).json()
    ours = requests.get(f"{stack.url}/system/info", auth=stack.auth, timeout=10).json()
    assert set(ce_info) == set(ours) and set(ours["version"]) <= set(ce_info["version"])
    assert ce_info["arch"] in ("", ours["arch"])  # CE's is set by its build's ldflags (TARGETARCH)
