"""The attack of issue 13, reproduced against a real stack: a deployed function reads whatever
credential its environment and its own files give it, uploads a malicious pickle and tries to
get it run. Before: its env held the cluster token, the scheduler stored the pickle, and the
next job unpickled it in the GPU Manager (`torch.load(weights_only=False)`) as root.

The stack: a provider with `--scheduler`, the scheduler and a GPU Manager (cpu back end), all
on the embedded datastore of one state folder, as `make up` runs them. The functions are
classic-watchdog `sh`, so no build is needed: each call runs the body as the function's own code,
which reads its own token from its file (issue 41: never from its environment, which `printenv`
shows anyone).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import requests
import torch

from faas_gpu.contract.wire import decode, encode
from tests.daemon_process import Daemon
from tests.malicious import (
    SavesAFile,
    exported_linear,
    hostile_program,
    hostile_torchscript,
    malicious_pickle,
    torchscript,
    zip_bomb,
)
from tests.stack_process import StackProcess


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("attack") / ".faas-gpu"
    home.mkdir()
    manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "64", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(home, "--scheduler", scheduler.url).start()
    stack.manager, stack.scheduler = manager, scheduler
    stack.cluster_token = (home / "secrets" / "gpu-manager-token").read_text().strip()
    yield stack
    stack.stop()
    scheduler.kill()
    manager.kill()


def deploy_printenv(stack, name: str, fprocess: str = "sh") -> None:
    body = {"service": name, "image": f"functions/{name}:latest", "envProcess": fprocess}
    r = requests.post(f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=10)
    assert r.status_code == 202, r.text
    stack.wait_ready(name)


def run(stack, name: str, script: str) -> str:
    """What the function's own code (`sh` running the body) prints."""
    r = requests.post(f"{stack.url}/function/{name}", data=script.encode(), timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def stolen(stack, name: str) -> str:
    """The token a function's own code holds: its token file (the attacker controls that code)."""
    token = run(stack, name, 'cat "$FAAS_GPU_TOKEN_FILE"').strip()
    assert token and " " not in token, token
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def upload(stack, token: str, data: bytes) -> requests.Response:
    return requests.put(f"{stack.scheduler.url}/v1/models", data=data, headers=bearer(token), timeout=60)


def job(stack, token: str, digest: str, x: torch.Tensor | None = None) -> requests.Response:
    x = torch.ones(1, 2) if x is None else x
    return requests.post(f"{stack.scheduler.url}/v1/jobs/{digest}", data=encode(x), headers=bearer(token), timeout=120)


def test_no_replica_environment_holds_the_cluster_token(gpu_stack):
    deploy_printenv(gpu_stack, "env-only", "env")  # the printenv example: its env, to anyone
    shown = requests.post(f"{gpu_stack.url}/function/env-only", data=b"", timeout=30).text
    env = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert gpu_stack.cluster_token not in shown and "FAAS_GPU_TOKEN" not in env
    assert env["FAAS_GPU_SCHEDULER_URL"] == gpu_stack.scheduler.url
    deploy_printenv(gpu_stack, "printenv")
    mine = stolen(gpu_stack, "printenv")  # its own code reads its own token, never the cluster's
    assert mine != gpu_stack.cluster_token and mine not in shown


def test_the_malicious_pickle_attack_is_refused_and_nothing_runs(gpu_stack, tmp_path):
    deploy_printenv(gpu_stack, "printenv")
    token = stolen(gpu_stack, "printenv")
    marker = tmp_path / "pwned"
    payload = malicious_pickle(marker)
    r = upload(gpu_stack, token, payload)
    assert r.status_code == 400 and "pickle is refused" in r.text and "torch.export" in r.text
    r = job(gpu_stack, token, hashlib.sha256(payload).hexdigest())
    assert r.status_code == 403 and "was not uploaded by function printenv.openfaas-fn" in r.text
    # TorchScript that writes a file when it runs: stored (nothing shows it before loading), never run
    script = torchscript(SavesAFile(str(marker)))
    r = upload(gpu_stack, token, script)
    assert r.status_code == 201, r.text
    r = job(gpu_stack, token, r.json()["digest"])
    assert r.status_code == 400 and "aten::save, which is not allowed" in r.text
    # and the managers take nothing but the cluster token
    r = requests.get(f"{gpu_stack.manager.url}/v1/units", headers=bearer(token), timeout=10)
    assert r.status_code == 401
    time.sleep(0.5)
    assert not marker.exists()


def test_a_pickle_is_refused_even_with_the_cluster_token(gpu_stack, tmp_path):
    marker = tmp_path / "pwned"
    payload = malicious_pickle(marker)
    r = upload(gpu_stack, gpu_stack.cluster_token, payload)
    assert r.status_code == 400 and "pickle is refused" in r.text
    r = job(gpu_stack, gpu_stack.cluster_token, hashlib.sha256(payload).hexdigest())
    assert r.status_code == 404 and "has not been uploaded" in r.text
    assert not list((gpu_stack.home / "scheduler-models").glob(f"{hashlib.sha256(payload).hexdigest()}*"))
    assert not marker.exists()


def test_a_functions_credential_cannot_run_another_functions_model(gpu_stack):
    deploy_printenv(gpu_stack, "printenv")
    deploy_printenv(gpu_stack, "owner")
    mine, theirs = stolen(gpu_stack, "printenv"), stolen(gpu_stack, "owner")
    assert mine != theirs
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 3).eval()
    artifact = torchscript(model)
    r = upload(gpu_stack, theirs, artifact)
    assert r.status_code == 201, r.text
    digest = r.json()["digest"]
    ok = job(gpu_stack, theirs, digest)
    assert ok.status_code == 200, ok.text
    assert torch.allclose(decode(ok.content), model(torch.ones(1, 2)), atol=1e-6)
    r = job(gpu_stack, mine, digest)
    assert r.status_code == 403 and "a function runs only models it uploaded itself" in r.text
    # the scheduler's status is the cluster's
    r = requests.get(f"{gpu_stack.scheduler.url}/v1/status", headers=bearer(mine), timeout=10)
    assert r.status_code == 403 and "cluster token" in r.text
    # uploading the same bytes proves possession: then it may run them
    assert upload(gpu_stack, mine, artifact).json()["digest"] == digest
    assert job(gpu_stack, mine, digest).status_code == 200
    # the manager counts jobs by function (accounting only)
    counts = requests.get(
        f"{gpu_stack.manager.url}/v1/functions", headers=bearer(gpu_stack.cluster_token), timeout=10
    ).json()
    assert counts.get("owner.openfaas-fn", 0) >= 1 and counts.get("printenv.openfaas-fn", 0) >= 1


def test_a_removed_functions_credential_stops_working(gpu_stack):
    deploy_printenv(gpu_stack, "doomed")
    token = stolen(gpu_stack, "doomed")
    assert upload(gpu_stack, token, torchscript(torch.nn.Linear(2, 2))).status_code == 201
    r = requests.delete(
        f"{gpu_stack.url}/system/functions", json={"functionName": "doomed"}, auth=gpu_stack.auth, timeout=30
    )
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 10
    while upload(gpu_stack, token, torchscript(torch.nn.Linear(2, 2))).status_code != 401:
        assert time.monotonic() < deadline, "the removed function's token still works"
        time.sleep(0.2)
    assert time.monotonic() < deadline


@pytest.mark.parametrize("daemon, path", [("manager", "/v1/units"), ("scheduler", "/v1/status")])
def test_a_non_ascii_bearer_token_is_401_not_500(gpu_stack, daemon, path):
    url = getattr(gpu_stack, daemon).url
    r = requests.get(f"{url}{path}", headers={"Authorization": "Bearer ä".encode()}, timeout=10)
    assert r.status_code == 401 and "invalid token" in r.text


def peak_rss_mb(pid: int) -> float:
    """The largest peak resident memory (VmHWM) of `pid` and its children (gunicorn's worker)."""
    pids = [pid] + [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    peaks = []
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return max(peaks)


def test_archives_two_readers_would_read_apart_are_refused_and_nothing_runs(gpu_stack, tmp_path):
    """Issue 41, finding 2, as it was done: a function's token, an archive whose hostile entry only
    torch's reader takes (a .pt2 whose shape expression is a command; TorchScript whose __setstate__
    writes a file), uploaded to the scheduler, and to a manager with the cluster token."""
    deploy_printenv(gpu_stack, "printenv")
    token = stolen(gpu_stack, "printenv")
    marker = tmp_path / "pwned"
    for payload in (hostile_program(exported_linear(), marker), hostile_torchscript(marker)):
        r = upload(gpu_stack, token, payload)
        assert r.status_code == 400 and "appears twice" in r.text, r.text
        r = job(gpu_stack, token, hashlib.sha256(payload).hexdigest())
        assert r.status_code == 403
        r = requests.put(
            f"{gpu_stack.manager.url}/v1/models", data=payload, headers=bearer(gpu_stack.cluster_token), timeout=60
        )
        assert r.status_code == 400 and "appears twice" in r.text, r.text
    time.sleep(0.5)
    assert not marker.exists()


def test_a_zip_bomb_is_refused_and_no_daemon_inflates_it(gpu_stack):
    """Issue 41, finding 3: 298 KiB declaring 300 MiB of model.json was stored (201) and took the
    scheduler to 866 MB and the manager from 248 to 859 MB. Refused now from the archive's directory:
    neither daemon's peak memory moves by more than the upload's own size."""
    deploy_printenv(gpu_stack, "printenv")
    token = stolen(gpu_stack, "printenv")
    bomb = zip_bomb(exported_linear())
    for daemon, send in (
        (gpu_stack.scheduler, lambda: upload(gpu_stack, token, bomb)),
        (
            gpu_stack.manager,
            lambda: requests.put(
                f"{gpu_stack.manager.url}/v1/models", data=bomb, headers=bearer(gpu_stack.cluster_token), timeout=60
            ),
        ),
    ):
        before = peak_rss_mb(daemon.proc.pid)
        r = send()
        assert r.status_code == 400 and "zip bomb" in r.text, r.text
        assert peak_rss_mb(daemon.proc.pid) - before < 50
