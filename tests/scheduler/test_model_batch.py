"""The batch a model accepts, read by the scheduler at upload and kept with the function's upload
record (issue 43), against a real scheduler process and the real (sealed) datastore."""

from __future__ import annotations

import io

import requests
import torch

from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import FunctionCredentials, uploaded_batches
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
