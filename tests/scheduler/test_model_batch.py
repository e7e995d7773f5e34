"""The batch a model accepts, read by the scheduler at upload and kept with the function's upload
record, and a batch the model refuses answered before it is placed (issue 43), against real
scheduler and GPU Manager processes and the real (sealed) datastore."""

from __future__ import annotations

import io

import requests
import torch

from faas_gpu.contract.errors import code_of
from faas_gpu.contract.wire import encode
from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import FunctionCredentials, uploaded_batches
from tests.daemon_process import wait_units
from tests.malicious import edit_json, tampered


def _static_one() -> bytes:
    buf = io.BytesIO()
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),)), buf)
    return buf.getvalue()


def test_the_upload_answers_the_models_batch_and_keeps_it_for_the_function(cluster, etcd_server, tmp_path):
    start, _auth = cluster
    sched = start("scheduler")
    ds = open_datastore(etcd_server.url, cluster_token=ensure_token(tmp_path / "secrets"))  # as the provider
    try:
        fn = {"Authorization": f"Bearer {FunctionCredentials(ds, tmp_path / 'tokens').issue('openfaas-fn', 'tiny')}"}
        program = _static_one()
        up = requests.put(f"{sched.url}/v1/models", data=program, headers=fn, timeout=30)
        assert up.status_code == 201, up.text
        assert up.json()["batch"] == {"kind": "static", "min": 1, "max": 1, "text": "static 1"}
        kept = uploaded_batches(ds, "openfaas-fn", "tiny")
        assert {d: b.text() for d, b in kept.items()} == {up.json()["digest"]: "static 1"}

        garbled = tampered(
            program,
            lambda e: edit_json(
                e, "models/model.json", lambda d: d["graph_module"]["graph"]["tensor_values"]["input"].update(sizes={})
            ),
        )
        bad = requests.put(f"{sched.url}/v1/models", data=garbled, headers=fn, timeout=30)
        assert bad.status_code == 400 and "tensor_values['input'].sizes is not a list" in bad.text, bad.text
    finally:
        ds.close()


def test_a_batch_its_model_refuses_is_answered_400_before_it_is_placed(cluster, etcd_server, tmp_path):
    start, auth = cluster
    manager = start("gpu_manager", "--node", "n1", "--units", "1", "--unit-memory-mb", "8")
    sched = start("scheduler")
    wait_units(sched.url, auth, 1)
    ds = open_datastore(etcd_server.url, cluster_token=ensure_token(tmp_path / "secrets"))  # as the provider
    try:
        fn = {"Authorization": f"Bearer {FunctionCredentials(ds, tmp_path / 'tokens').issue('openfaas-fn', 'tiny')}"}
        digest = requests.put(f"{sched.url}/v1/models", data=_static_one(), headers=fn, timeout=30).json()["digest"]
        job = f"{sched.url}/v1/jobs/{digest}"
        r = requests.post(job, data=encode(torch.randn(3, 4)), headers=fn, timeout=60)
        assert r.status_code == 400 and code_of(r.headers) == "batch-refused", (r.status_code, r.headers, r.text)
        assert r.text.startswith("shape[0]: a batch of 3 rows") and "accepts batch static 1" in r.text, r.text
        units = requests.get(f"{manager.url}/v1/units", headers=auth, timeout=5).json()
        assert all(not u["models"] for u in units), units  # never placed: nothing was loaded for it
        assert requests.post(job, data=encode(torch.randn(1, 4)), headers=fn, timeout=60).status_code == 200
    finally:
        ds.close()
