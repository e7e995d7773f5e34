"""The GPU Manager daemon over real HTTP: token, upload, jobs, status in the datastore."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402

from tests.torchscript import torchscript_bytes


@pytest.fixture(scope="module")
def artifact() -> bytes:
    torch.manual_seed(0)
    return torchscript_bytes(ResNetMini().eval())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, etcd_server):
    home = tmp_path_factory.mktemp("gm")
    port = free_port()
    log = open(home / "gm.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_manager",
            "--home",
            str(home),
            "--port",
            str(port),
            "--units",
            "2",
            "--unit-memory-mb",
            "2",
            "--max-model-bytes",
            "5000000",
            *etcd_server.daemon_args(),
            "--node",
            "n1",
        ],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.1)
    token = (home / "secrets" / "gpu-manager-token").read_text().strip()
    yield url, {"Authorization": f"Bearer {token}"}, home, etcd_server
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)


def test_token_is_required(daemon):
    url, _, home, _ = daemon
    assert requests.get(f"{url}/v1/units", timeout=5).status_code == 401
    assert requests.get(f"{url}/v1/units", headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
    assert oct((home / "secrets" / "gpu-manager-token").stat().st_mode & 0o777) == "0o600"


def test_upload_then_run_a_job_with_hit_and_miss_headers(daemon, artifact):
    url, auth, _, _ = daemon
    r = requests.put(f"{url}/v1/models", data=artifact, headers=auth, timeout=30)
    assert r.status_code == 201 and r.json()["format"] == "torchscript"
    digest = r.json()["digest"]
    x = torch.randn(2, 3, 32, 32)
    r = requests.post(f"{url}/v1/jobs/{digest}?unit=cpu-0", data=encode(x), headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["X-Faas-Gpu-Unit"] == "cpu-0" and r.headers["X-Faas-Gpu-Cache"] == "miss"
    assert decode(r.content).shape == (2, 10)
    r = requests.post(f"{url}/v1/jobs/{digest}?unit=cpu-0", data=encode(x), headers=auth, timeout=60)
    assert r.headers["X-Faas-Gpu-Cache"] == "hit"


def test_bad_input_answers(daemon, artifact):
    url, auth, _, _ = daemon
    digest = requests.put(f"{url}/v1/models", data=artifact, headers=auth, timeout=30).json()["digest"]
    r = requests.post(
        f"{url}/v1/jobs/{digest}?unit=cpu-1", data=encode(torch.randn(1, 7, 32, 32)), headers=auth, timeout=60
    )
    assert r.status_code == 400 and r.text.startswith("model:")
    r = requests.post(f"{url}/v1/jobs/{digest}?unit=cpu-1", data=b"garbage", headers=auth, timeout=10)
    assert r.status_code == 400 and "FGT1" in r.text
    assert (
        requests.post(
            f"{url}/v1/jobs/{'a' * 64}?unit=cpu-1", data=encode(torch.zeros(1)), headers=auth, timeout=10
        ).status_code
        == 404
    )
    assert requests.put(f"{url}/v1/models", data=b"x" * 6_000_000, headers=auth, timeout=30).status_code == 413
    assert requests.put(f"{url}/v1/models", data=artifact[:1000], headers=auth, timeout=30).status_code == 400


def test_model_larger_than_the_unit_is_507(tmp_path, artifact):
    # the module daemon's units hold 2 MB; this manager's only 0.1 MB
    from faas_gpu.models import ModelStore
    from gpu_manager.api import create_app
    from gpu_manager.discovery import cpu_units
    from gpu_manager.manager import GPUManager

    store = ModelStore(tmp_path)
    digest = store.put(artifact).digest
    client = create_app(GPUManager(cpu_units(1, 0.1), store), "t").test_client()
    r = client.post(
        f"/v1/jobs/{digest}?unit=cpu-0", data=encode(torch.randn(1, 3, 32, 32)), headers={"Authorization": "Bearer t"}
    )
    assert r.status_code == 507 and b"does not fit" in r.data


def test_unit_status_is_reported_into_the_datastore(daemon):
    _, _, home, etcd = daemon
    ds = open_datastore(etcd.url, cluster_token=ensure_token(home / "secrets"))  # sealed: read as the scheduler does
    try:
        deadline = time.monotonic() + 10
        units = []
        while time.monotonic() < deadline and len(units) < 2:
            units = [json.loads(kv.value) for kv in ds.get_prefix("/faas-gpu/units/n1/")]
            time.sleep(0.2)
        assert sorted(u["unit"] for u in units) == ["cpu-0", "cpu-1"]
        assert all(u["state"] in ("idle", "busy") and u["node"] == "n1" for u in units)
        assert all(kv.lease for kv in ds.get_prefix("/faas-gpu/units/n1/"))
    finally:
        ds.close()


def test_the_daemon_says_what_walls_its_workers_run_behind(daemon, artifact):
    """Issue 41: the manager probes its workers' walls at start and says what they are (or, where
    the kernel allows none, that they are not isolated); its workers run behind them."""
    url, auth, home, _ = daemon
    log = (home / "gm.log").read_text()
    if os.geteuid() == 0:
        assert "model workers isolated: uid 64999, namespaces mnt+net+ipc, no_new_privs, seccomp" in log, log[-2000:]
    else:
        assert "model workers isolated" in log or "model workers are NOT isolated" in log
    digest = requests.put(f"{url}/v1/models", data=artifact, headers=auth, timeout=30).json()["digest"]
    x = encode(torch.randn(1, 3, 32, 32))
    r = requests.post(f"{url}/v1/jobs/{digest}?unit=cpu-1", data=x, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    if os.geteuid() == 0:  # the store is given to the workers' group, and to no one else
        st = (home / "models").stat()
        assert (st.st_gid, st.st_mode & 0o777) == (64999, 0o750)
