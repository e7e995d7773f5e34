"""A batch the model does not accept is the GPU Manager's own 400, before anything runs (issue 43).

The client's batch queue keeps within what a program accepts (`faas_gpu.models.batch_limits`),
but a manager also takes batches from callers that need not have: a stale client, or a hostile
one holding a function's token and a lease, sent straight here. Before, such a batch was loaded
and handed to torch, whose own refusal came back as `400 model: Expected input at
*args[0].shape[0] to be equal to 1, but got 3`. The real manager, its API over real HTTP and
its real worker (torch on the CPU).
"""

from __future__ import annotations

import io
import threading
import time

import pytest
import requests
import torch
from torch.export import Dim
from werkzeug.serving import make_server

from faas_gpu.contract import headers as h
from faas_gpu.contract.errors import code_of
from faas_gpu.contract.lease import Lease, sign, token_sha256
from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager.api import create_app
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager

CLUSTER_TOKEN = "cluster-token-for-this-test"
FN_TOKEN = "the-function-token"


def _program(example_rows: int, dynamic_shapes=None) -> bytes:
    torch.manual_seed(0)
    buf = io.BytesIO()
    program = torch.export.export(
        torch.nn.Linear(4, 2).eval(), (torch.randn(example_rows, 4),), dynamic_shapes=dynamic_shapes
    )
    torch.export.save(program, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    store = ModelStore(tmp_path_factory.mktemp("models"))
    static = store.put(_program(1)).digest  # torch.export with one example: a static batch of 1
    upto8 = store.put(_program(3, ({0: Dim("batch", min=1, max=8)},))).digest
    mgr = GPUManager(cpu_units(1, 64), store)
    server = make_server("127.0.0.1", 0, create_app(mgr, CLUSTER_TOKEN), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", mgr, static, upto8
    finally:
        server.shutdown()
        mgr.close()


def _post(url: str, digest: str, x: torch.Tensor, headers: dict[str, str]) -> requests.Response:
    return requests.post(
        f"{url}/v1/jobs/{digest}", params={"unit": "cpu-0"}, data=encode(x), headers=headers, timeout=60
    )


def _leased(digest: str) -> dict[str, str]:
    lease = Lease(digest, "cpu-0", "tiny.openfaas-fn", token_sha256(FN_TOKEN), time.time() + 30)
    return {"Authorization": f"Bearer {FN_TOKEN}", h.LEASE: sign(CLUSTER_TOKEN, lease)}


def _refused(r: requests.Response, accepts: str, field: str = "shape[0]") -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    assert code_of(r.headers) == "batch-refused", r.headers
    assert r.text.startswith(f"{field}:") and f"accepts batch {accepts}" in r.text, r.text
    assert "Expected input" not in r.text  # the manager's words, not torch's


def test_a_batch_over_a_static_models_batch_is_refused_before_it_is_loaded(manager):
    url, mgr, static, _ = manager
    cluster = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    r = _post(url, static, torch.randn(3, 4), cluster)  # the scheduler's path: the cluster's token
    _refused(r, "static 1")
    assert "a batch of 3 rows" in r.text
    assert not any(d == static for d, _ in mgr.workers), "refused, yet its model was loaded"
    assert _post(url, static, torch.randn(1, 4), cluster).status_code == 200  # the batch it accepts runs


def test_a_leased_batch_the_model_refuses_gets_the_same_answer(manager):
    url, mgr, static, _ = manager
    r = _post(url, static, torch.randn(3, 4), _leased(static))  # a function's token, straight to the manager
    _refused(r, "static 1")
    # hostile shapes: an empty first dimension, a huge one with no bytes, no batch dimension at all
    _refused(_post(url, static, torch.randn(0, 4), _leased(static)), "static 1")
    _refused(_post(url, static, torch.empty(2**40, 0), _leased(static)), "static 1")
    _refused(_post(url, static, torch.tensor(1.0), _leased(static)), "static 1", field="shape")


def test_a_dynamic_models_maximum_is_kept_and_batches_within_it_run(manager):
    url, _, _, upto8 = manager
    cluster = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    _refused(_post(url, upto8, torch.randn(9, 4), cluster), "dynamic 1..8")
    for rows in (1, 8):
        r = _post(url, upto8, torch.randn(rows, 4), cluster)
        assert r.status_code == 200, r.text
        assert decode(r.content).shape == (rows, 2)
