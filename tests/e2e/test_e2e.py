"""End to end: build python3-gpu functions from a stack file, deploy and drive them with the CLI.

The torch example runs a real model on the CPU inside its replica.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import requests
import yaml

from faas_gpu.paths import REPO_ROOT
from tests.stack_process import StackProcess

FAULTY = """
import time

def handle(event, context):
    if event.path == "/raise":
        raise ValueError("bad things")
    if event.path == "/hang":
        time.sleep(60)
    return {"statusCode": 200, "body": "fine"}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    for name in ("echo", "classify"):
        shutil.copytree(
            REPO_ROOT / "functions" / name, root / name, ignore=shutil.ignore_patterns("*.pt", "__pycache__")
        )
    (root / "faulty").mkdir()
    (root / "faulty" / "handler.py").write_text(FAULTY)
    stack = {
        "version": 1.0,
        "provider": {"name": "openfaas", "gateway": "http://127.0.0.1:8080"},
        "functions": {
            "echo": {"lang": "python3-gpu", "handler": "./echo", "image": "e2e/echo:latest"},
            "classify": {
                "lang": "python3-gpu",
                "handler": "./classify",
                "image": "e2e/classify:latest",
                "annotations": {"com.faas-gpu.slo-ms": "200"},
            },
            "faulty": {
                "lang": "python3-gpu",
                "handler": "./faulty",
                "image": "e2e/faulty:latest",
                "environment": {"exec_timeout": "2s"},
            },
        },
    }
    (root / "stack.yml").write_text(yaml.safe_dump(stack))
    return root


@pytest.fixture(scope="module")
def stack(project):
    s = StackProcess(project / ".faas-gpu").start()
    yield s
    s.stop()


def cli(project, stack, *args, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:  # noqa: A002
    env = {**os.environ, "FAAS_GPU_HOME": str(stack.home)}
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", *args],
        cwd=project,
        env=env,
        input=input,
        capture_output=True,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    return proc


@pytest.fixture(scope="module")
def deployed(project, stack):
    cli(project, stack, "build", "-f", "stack.yml")
    cli(project, stack, "deploy", "-f", "stack.yml", "--gateway", stack.url)
    for name in ("echo", "classify", "faulty"):
        stack.wait_ready(name, timeout_s=120)
    return stack


def test_echo_and_torch_classifier_serve(project, deployed):
    out = cli(project, deployed, "invoke", "echo", "--gateway", deployed.url, input=b"hello e2e").stdout
    assert out == b"hello e2e"
    r = requests.post(f"{deployed.url}/function/classify", json={"seed": 0}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "resnet-mini" and body["batch"] == 1
    again = requests.post(f"{deployed.url}/function/classify.openfaas-fn", json={"seed": 0}, timeout=30).json()
    assert again == body  # same weights, same input, same answer
    batch = requests.post(
        f"{deployed.url}/function/classify", json={"inputs": [[[[0.0] * 32] * 32] * 3] * 2}, timeout=30
    )
    assert batch.json()["batch"] == 2
    bad = requests.post(f"{deployed.url}/function/classify", json={"inputs": [1, 2]}, timeout=30)
    assert bad.status_code == 400 and bad.text.startswith("inputs:")


def test_handler_that_raises_gets_500_and_survives(deployed):
    r = requests.post(f"{deployed.url}/function/faulty/raise", timeout=30)
    assert r.status_code == 500 and "bad things" in r.text
    assert requests.post(f"{deployed.url}/function/faulty", timeout=30).text == "fine"


def test_handler_that_hangs_gets_504(deployed):
    t0 = time.monotonic()
    r = requests.post(f"{deployed.url}/function/faulty/hang", timeout=30)
    assert r.status_code == 504 and time.monotonic() - t0 < 20
    assert requests.post(f"{deployed.url}/function/faulty", timeout=30).text == "fine"


def test_cli_list_describe_logs_remove(project, deployed):
    listing = cli(project, deployed, "list", "--gateway", deployed.url).stdout.decode()
    assert "classify" in listing and "echo" in listing
    described = cli(project, deployed, "describe", "classify", "--gateway", deployed.url).stdout.decode()
    assert "Status:              Ready" in described and "com.faas-gpu.slo-ms" in described
    logs = cli(project, deployed, "logs", "classify", "--no-follow", "--gateway", deployed.url).stdout.decode()
    assert "Listening on port" in logs
    cli(project, deployed, "secret", "create", "token", "--from-literal", "abc", "--gateway", deployed.url)
    assert "token" in cli(project, deployed, "secret", "list", "--gateway", deployed.url).stdout.decode()
    cli(project, deployed, "secret", "remove", "token", "--gateway", deployed.url)
    cli(project, deployed, "remove", "echo", "--gateway", deployed.url)
    missing = cli(project, deployed, "remove", "echo", "--gateway", deployed.url, check=False)
    assert missing.returncode == 1 and b"No existing function" in missing.stderr


def test_cli_errors_are_one_clear_line(project, stack):
    proc = cli(project, stack, "list", "--gateway", "http://127.0.0.1:9", check=False)
    assert proc.returncode == 1 and proc.stderr.decode().startswith("faas-gpu: cannot reach gateway")
    (project / "broken.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\nfunctions: {x: {image: 3, lang: []}}\n"
    )
    proc = cli(project, stack, "deploy", "-f", "broken.yml", check=False)
    assert proc.returncode == 1 and b"broken.yml: functions.x.lang" in proc.stderr


def test_new_and_template_pull_work_offline(tmp_path, stack):
    proc = cli(tmp_path, stack, "template", "pull")
    assert (tmp_path / "template" / "python3-gpu" / "template.yml").is_file()
    meta = json.loads((tmp_path / "template" / "python3-gpu" / "meta.json").read_text())
    assert {"repository", "sha", "written_at"} <= set(meta)
    proc = cli(tmp_path, stack, "new", "my-fn")  # python3-gpu is the default lang
    assert b"Function created" in proc.stdout
    assert (tmp_path / "my-fn" / "handler.py").is_file()
    data = yaml.safe_load((tmp_path / "stack.yaml").read_text())
    assert data["functions"]["my-fn"] == {"lang": "python3-gpu", "handler": "./my-fn", "image": "my-fn:latest"}
    assert {"template", "build", ".secrets"} <= set((tmp_path / ".gitignore").read_text().split())
    cli(tmp_path, stack, "build", "--shrinkwrap")
    assert (tmp_path / "build" / "my-fn" / "function" / "handler.py").is_file()
    bad = cli(tmp_path, stack, "new", "Bad_Name", "--lang", "python3-gpu", check=False)
    assert bad.returncode == 1
