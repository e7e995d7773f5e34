"""The GPU path does not wait on the datastore (issue 42).

With etcd away, every job route used to wait on it: the function's token and its model's owner
were read again once their cache expired (etcd's retries: 5 s per call on a hung etcd), and the
placement loop reread the units' reports in its own thread, so every job waited behind each read.
Here etcd hangs (SIGSTOP: it takes connections and answers nothing, as a partition or a stuck
disk looks), and a function the scheduler knows keeps its jobs, its leases and even a new upload
of its model (a replica restarted meanwhile) answered at the speed they had before. Real etcd,
real daemons (scheduler, GPU Manager on the sim back end), real HTTP.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests
import torch

from faas_gpu.contract import headers as h
from faas_gpu.contract.wire import encode
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import FunctionCredentials
from tests.classify_model import scripted_resnet
from tests.daemon_process import Daemon, wait_units
from tests.servers import EtcdServer

HUNG_ETCD_CALL_S = 5.0  # what one call to a hung etcd costs a daemon (etcd.TIMEOUT_S)


@pytest.mark.timeout(240)
def test_a_known_functions_jobs_leases_and_uploads_do_not_wait_on_a_hung_etcd(tmp_path):
    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    token = ensure_token(tmp_path / "secrets")
    cluster = {"Authorization": f"Bearer {token}"}
    profile = tmp_path / "profile.txt"
    profile.write_text("m 8 50 1 5\nm 8 50 8 5\n")
    args = etcd.daemon_args()
    manager = Daemon("gpu_manager", tmp_path, *args, "--backend", "sim", "--sim-profile", str(profile), "--units", "1")
    sched = Daemon("scheduler", tmp_path, *args)
    ds = open_datastore(etcd.url, cluster_token=token)  # as the provider opens it
    try:
        wait_units(sched.url, cluster, 1)
        fn_token = FunctionCredentials(ds, tmp_path / "tokens").issue("openfaas-fn", "classify")
        fn = {"Authorization": f"Bearer {fn_token}"}
        artifact, _ = scripted_resnet(1)
        up = requests.put(f"{sched.url}/v1/models", data=artifact, headers=fn, timeout=30)
        assert up.status_code == 201, up.text
        digest = up.json()["digest"]
        x = encode(torch.zeros(1, 4))
        strict = {**fn, h.CLASS: "strict", h.BUDGET_MS: "10000"}
        assert requests.post(f"{sched.url}/v1/jobs/{digest}", data=x, headers=strict, timeout=30).status_code == 200

        os.kill(etcd.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(3.5)  # past the credentials' cache (2 s) and the leader's lease (3 s)
            slowest = 0.0
            until = time.monotonic() + 8
            while time.monotonic() < until:
                for method, path, body, headers in (
                    ("POST", f"/v1/jobs/{digest}", x, strict),
                    ("POST", f"/v1/jobs/{digest}", x, {**fn, h.CLASS: "best-effort"}),
                    ("POST", f"/v1/leases/{digest}", None, strict),
                    ("PUT", "/v1/models", artifact, fn),  # the same model again, from a replica started meanwhile
                ):
                    t0 = time.monotonic()
                    r = requests.request(method, sched.url + path, data=body, headers=headers, timeout=60)
                    took = time.monotonic() - t0
                    assert r.status_code in (200, 201, 204), (method, path, r.status_code, r.text)
                    slowest = max(slowest, took)
                time.sleep(0.1)
            # each answer as prompt as before the outage: none waited on the hung etcd
            assert slowest < HUNG_ETCD_CALL_S / 2, f"a call waited {slowest:.1f} s on the hung datastore"
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        assert manager.proc.poll() is None and sched.proc.poll() is None
    finally:
        ds.close()
        manager.kill()
        sched.kill()
        etcd.stop()
