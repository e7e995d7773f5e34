"""A replica does not export again what an earlier replica of its function uploaded (issue 46).

Every replica of a python3-gpu function that builds its model in code exported it (torch.export)
and uploaded it on its first batch: seconds of every cold start, every wake-up from zero included,
for the same bytes. Here two replicas of one function (two clients on the real scheduler and GPU
Manager) build the same model: the second asks for the digest of the same source and neither
exports nor uploads; another function cannot learn that digest; a changed weight is a new source."""

from __future__ import annotations

import sys

import pytest
import requests
import torch

from faas_gpu import client
from faas_gpu.contract import headers as h
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.paths import REPO_ROOT
from faas_gpu.saving import source_digest
from tests.daemon_process import wait_units

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402


def replica(monkeypatch, sched_url: str, token: str, seed: int = 0) -> tuple[client.RemoteModel, torch.nn.Module]:
    """One replica's model: built in code from the same seed, behind the GPU client."""
    monkeypatch.setenv("FAAS_GPU_SCHEDULER_URL", sched_url)
    monkeypatch.setenv("FAAS_GPU_TOKEN", token)
    monkeypatch.setenv("FAAS_GPU_MAX_BATCH", "1")
    torch.manual_seed(seed)
    local = ResNetMini().eval()
    return client.remote(local), local


def test_a_second_replica_reuses_the_first_ones_upload_and_another_function_cannot(
    cluster, etcd_server, tmp_path, monkeypatch
):
    start, auth = cluster
    start("gpu_manager", "--node", "n1", "--units", "1", "--unit-memory-mb", "64")
    sched = start("scheduler")
    wait_units(sched.url, auth, 1)
    ds = open_datastore(etcd_server.url, cluster_token=ensure_token(tmp_path / "secrets"))  # as the provider
    creds = FunctionCredentials(ds, tmp_path / "function-tokens")
    token, other = creds.issue("openfaas-fn", "classify"), creds.issue("openfaas-fn", "other")
    x = torch.randn(1, 3, 32, 32)
    exports: list[str] = []
    real_export = client.RemoteModel._export

    def counted(self, example):
        exports.append(type(self.local).__name__)
        return real_export(self, example)

    monkeypatch.setattr(client.RemoteModel, "_export", counted)
    try:
        first, local = replica(monkeypatch, sched.url, token)
        assert torch.allclose(first(x), local(x), atol=1e-5)
        assert exports == ["ResNetMini"] and h.UPLOAD_SECONDS in client.last_job.get()

        second, local2 = replica(monkeypatch, sched.url, token)  # a new replica: same code, same weights
        assert torch.allclose(second(x), local2(x), atol=1e-5)
        assert exports == ["ResNetMini"]  # no second export
        assert second._digest == first._digest and second._looked_up

        source = source_digest(local, x)
        asked = requests.get(f"{sched.url}/v1/model-sources/{source}", headers={"Authorization": f"Bearer {other}"})
        assert asked.status_code == 404  # another function never learns this one's artifact
        bad = requests.get(f"{sched.url}/v1/model-sources/not-a-digest", headers={"Authorization": f"Bearer {token}"})
        assert bad.status_code == 400 and bad.text.startswith("source:")

        changed, local3 = replica(monkeypatch, sched.url, token, seed=1)  # other weights: another source
        assert source_digest(local3, x) != source
        assert torch.allclose(changed(x), local3(x), atol=1e-5)
        assert exports == ["ResNetMini", "ResNetMini"]
    finally:
        client.uninstall()


@pytest.mark.parametrize("shape", [(1, 3, 32, 32), (1, 3, 64, 64)])
def test_the_source_digest_is_the_same_for_the_same_module_and_input(shape):
    torch.manual_seed(0)
    a = ResNetMini().eval()
    torch.manual_seed(0)
    b = ResNetMini().eval()
    assert source_digest(a, torch.randn(*shape)) == source_digest(b, torch.randn(*shape))
    assert source_digest(a, torch.randn(*shape)) != source_digest(a.train(), torch.randn(*shape))
    assert source_digest(a.eval(), torch.randn(1, 3, 32, 32)) != source_digest(a, torch.randn(1, 3, 16, 16))
