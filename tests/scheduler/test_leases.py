"""Placement leases live: the scheduler leases a unit to a function's instance, which sends its
batches to the GPU Manager itself; the manager takes them only with the lease and the function's
own token; anything the direct path cannot take goes through the scheduler."""

from __future__ import annotations

import sys
import time

import requests
import torch

from faas_gpu import client
from faas_gpu.contract import headers as h
from faas_gpu.contract.lease import Lease, sign, token_sha256
from faas_gpu.contract.wire import encode
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.paths import REPO_ROOT
from tests.daemon_process import wait_units

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402


def test_a_function_sends_its_batches_to_the_leased_unit_and_falls_back_to_the_scheduler(
    cluster, etcd_server, tmp_path, monkeypatch
):
    start, auth = cluster
    manager = start("gpu_manager", "--node", "n1", "--units", "2", "--unit-memory-mb", "8")
    sched = start("scheduler")
    wait_units(sched.url, auth, 2)
    ds = open_datastore(etcd_server.url, cluster_token=ensure_token(tmp_path / "secrets"))  # as the provider
    creds = FunctionCredentials(ds, tmp_path / "function-tokens")
    token = creds.issue("openfaas-fn", "classify")
    other = {"Authorization": f"Bearer {creds.issue('openfaas-fn', 'other')}"}
    fn = {"Authorization": f"Bearer {token}"}
    monkeypatch.setenv("FAAS_GPU_SCHEDULER_URL", sched.url)
    monkeypatch.setenv("FAAS_GPU_TOKEN", token)
    monkeypatch.setenv("FAAS_GPU_MAX_BATCH", "1")
    try:
        torch.manual_seed(0)
        local = ResNetMini().eval()
        model = client.remote(local)
        x = torch.randn(1, 3, 32, 32)
        assert torch.allclose(model(x), local(x), atol=1e-5)  # the first batch loads the model through the queue
        assert h.QUEUE_SECONDS in client.last_job.get()
        digest = model._digest
        time.sleep(client.LEASE_RETRY_S)  # the first ask found the model nowhere: no lease then
        for _ in range(3):
            assert torch.allclose(model(x), local(x), atol=1e-5)
        lease = model._lease
        assert lease is not None and lease.url == manager.url
        assert h.QUEUE_SECONDS not in client.last_job.get()  # straight from the manager
        counted = requests.get(f"{manager.url}/v1/functions", headers=auth, timeout=5).json()
        assert counted.get("classify.openfaas-fn", 0) >= 3  # the manager counts the lease's function

        # the leased batches are told to the scheduler with the next ask, and counted as its own jobs
        time.sleep(max(0.0, lease.renew_at - time.monotonic()) + 0.05)
        model(x)
        assert model._lease is not lease and len(model._unreported) == 1  # this batch: told with the next ask
        metrics = requests.get(f"{sched.url}/metrics", headers=auth, timeout=5).text
        success = [line for line in metrics.splitlines() if line.startswith("nv_inference_request_success{")]
        assert success and float(success[0].split()[-1]) >= 4, success  # 1 through the queue, 3 leased

        # the scheduler: strict only, and only the model's owner
        url = f"{sched.url}/v1/leases/{digest}"
        assert requests.post(url, headers={**fn, h.CLASS: "best-effort"}, timeout=5).status_code == 204
        assert requests.post(url, headers=other, timeout=5).status_code == 403
        assert requests.post(url, timeout=5).status_code == 401
        deep = requests.post(url, headers=fn, data=b"[" * 100_000 + b"]" * 100_000, timeout=30)
        assert deep.status_code == 400 and "nested too deeply" in deep.text  # issue 41: was a 500

        # the manager: the function's token alone, or with a lease for something else, runs nothing
        job = f"{manager.url}/v1/jobs/{digest}"
        body = encode(x)
        assert requests.post(job, params={"unit": lease.unit}, data=body, headers=fn, timeout=30).status_code == 401
        good = {**fn, h.LEASE: lease.text}
        assert requests.post(job, params={"unit": lease.unit}, data=body, headers=good, timeout=30).status_code == 200
        elsewhere = "cpu-1" if lease.unit == "cpu-0" else "cpu-0"
        for unit, headers in (
            (elsewhere, good),  # another unit
            (lease.unit, {**other, h.LEASE: lease.text}),  # another function's token
            (
                lease.unit,
                {**fn, h.LEASE: sign("not-the-cluster", Lease(digest, lease.unit, "x.y", token_sha256(token), 1e12))},
            ),
        ):
            r = requests.post(job, params={"unit": unit}, data=body, headers=headers, timeout=30)
            assert r.status_code == 401 and r.headers[h.ERROR] == "lease-refused", r.text

        # a lease never loads a model: on a unit without it, 409 (the instance goes to the scheduler)
        cluster_token = auth["Authorization"][7:]
        there = sign(cluster_token, Lease(digest, elsewhere, "x.y", token_sha256(token), time.time() + 60))
        r = requests.post(job, params={"unit": elsewhere}, data=body, headers={**fn, h.LEASE: there}, timeout=30)
        assert r.status_code == 409, r.text
        units = requests.get(f"{manager.url}/v1/units", headers=auth, timeout=5).json()
        assert [u["unit"] for u in units if digest in u["models"]] == [lease.unit]

        # a leased manager that does not answer: the batch goes through the scheduler, the lease is dropped
        model._lease = client.HeldLease(
            "http://127.0.0.1:9", lease.unit, lease.text, time.monotonic() + 60, time.monotonic() + 60
        )
        assert torch.allclose(model(x), local(x), atol=1e-5)
        assert h.QUEUE_SECONDS in client.last_job.get() and model._lease is None
        # ... and with leases off every batch goes through the scheduler
        monkeypatch.setenv("FAAS_GPU_LEASES", "off")
        plain = client.remote(local)
        plain._artifact = None
        for _ in range(2):
            assert torch.allclose(plain(x), local(x), atol=1e-5)
            assert h.QUEUE_SECONDS in client.last_job.get()
        assert plain._lease is None
    finally:
        ds.close()


def test_leased_batch_reports_that_are_not_a_measured_time_are_not_learnt():
    """A function reports its leased batches' execution times, which the scheduler learns for the
    model (shared with other functions): NaN, infinity or beyond an hour is no measurement."""
    from scheduler.metrics import SchedulerMetrics

    metrics = SchedulerMetrics("lalb")
    ran = [[1, 200, "nan", True, ""], [1, 200, "inf", True, ""], [1, 200, 1e9, True, ""], [2, 200, 0.004, True, ""]]
    assert metrics.leased("d" * 64, "m", "f.openfaas-fn", ran) == [0.004]
