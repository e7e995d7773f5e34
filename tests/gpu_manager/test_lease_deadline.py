"""A batch sent straight to a GPU Manager under a lease is not run past its deadline (issue 42).

The scheduler never starts a strict job whose deadline has passed; the lease path skips the
scheduler, so the manager holds the same line: the budget the instance sends with the batch
becomes a deadline when the batch arrives, and a batch still waiting for its unit then is answered
as the scheduler answers a late job (504, `X-Faas-Gpu-Deadline-Missed: true`, the same wording and
code), never run. The real manager and its API over real HTTP; the model worker is the tests'
fake (`tests/fake_worker.py`), gated to hold the unit.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from werkzeug.serving import make_server

from faas_gpu import client
from faas_gpu.batching import BatchClass
from faas_gpu.contract import headers as h
from faas_gpu.contract.lease import Lease, sign, token_sha256
from faas_gpu.contract.wire import encode
from faas_gpu.models import ModelStore
from gpu_manager.api import create_app
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from tests.fake_worker import FakeWorker, stored_program

CLUSTER_TOKEN = "cluster-token-for-this-test"
FN_TOKEN = "the-function-token"


class _Counted(FakeWorker):
    ran = 0

    def run(self, payload, timeout_s=60):
        out = super().run(payload, timeout_s)
        type(self).ran += 1
        return out


@pytest.fixture
def manager(tmp_path):
    store = ModelStore(tmp_path / "models")
    digest = stored_program(store)
    gate = threading.Event()
    _Counted.ran = 0
    mgr = GPUManager(cpu_units(1, 64), store, worker_factory=lambda a, d, env=None: _Counted(a, d, env, gate))
    server = make_server("127.0.0.1", 0, create_app(mgr, CLUSTER_TOKEN), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", digest, gate
    finally:
        gate.set()
        server.shutdown()
        mgr.close()


def _lease(digest: str) -> str:
    return sign(CLUSTER_TOKEN, Lease(digest, "cpu-0", "classify.openfaas-fn", token_sha256(FN_TOKEN), time.time() + 60))


def _hold_the_unit(url: str, digest: str, pool: ThreadPoolExecutor):
    """A job of the cluster's that loads the model and then holds the unit until the gate opens."""
    busy = pool.submit(
        requests.post,
        f"{url}/v1/jobs/{digest}",
        params={"unit": "cpu-0"},
        data=encode(torch.zeros(1, 2)),
        headers={"Authorization": f"Bearer {CLUSTER_TOKEN}"},
        timeout=30,
    )
    deadline = time.monotonic() + 10
    while not FakeWorker.made or not FakeWorker.made[-1].alive:
        assert time.monotonic() < deadline, "the first job did not start"
        time.sleep(0.01)
    time.sleep(0.05)  # it runs now (the gate holds it), the unit's lock taken
    return busy


def test_a_leased_batch_whose_deadline_passes_while_its_unit_is_busy_is_answered_a_miss_and_not_run(manager):
    url, digest, gate = manager
    leased = {"Authorization": f"Bearer {FN_TOKEN}", h.LEASE: _lease(digest)}
    with ThreadPoolExecutor(4) as pool:
        busy = _hold_the_unit(url, digest, pool)
        late = pool.submit(
            requests.post,
            f"{url}/v1/jobs/{digest}",
            params={"unit": "cpu-0"},
            data=encode(torch.ones(1, 2)),
            headers={**leased, h.BUDGET_MS: "50"},
            timeout=30,
        )
        time.sleep(0.3)  # past its 50 ms, waiting for the unit
        gate.set()
        assert busy.result().status_code == 200
        r = late.result()
    assert r.status_code == 504, r.text
    assert r.headers[h.DEADLINE_MISSED] == "true" and r.headers[h.ERROR] == "deadline-missed"
    assert "missed its deadline" in r.text and "before a GPU unit could start it; not run" in r.text
    assert _Counted.ran == 1  # the busy job only: the late batch never reached the model

    # a spent budget is a miss at once; one with time left runs; a budget that is no number is the caller's 400
    spent = requests.post(
        f"{url}/v1/jobs/{digest}",
        params={"unit": "cpu-0"},
        data=encode(torch.ones(1, 2)),
        headers={**leased, h.BUDGET_MS: "0"},
        timeout=30,
    )
    assert spent.status_code == 504 and spent.headers[h.DEADLINE_MISSED] == "true"
    ok = requests.post(
        f"{url}/v1/jobs/{digest}",
        params={"unit": "cpu-0"},
        data=encode(torch.ones(1, 2)),
        headers={**leased, h.BUDGET_MS: "5000"},
        timeout=30,
    )
    assert ok.status_code == 200, ok.text
    bad = requests.post(
        f"{url}/v1/jobs/{digest}",
        params={"unit": "cpu-0"},
        data=encode(torch.ones(1, 2)),
        headers={**leased, h.BUDGET_MS: "soon"},
        timeout=30,
    )
    assert bad.status_code == 400 and h.BUDGET_MS in bad.text
    assert _Counted.ran == 2


def test_the_instance_sends_its_budget_with_a_leased_batch_and_answers_the_units_miss_without_a_retry(
    manager, monkeypatch
):
    """The instance's side: the budget left travels with the leased batch, and the manager's miss
    is the call's answer (504, not sent again through the scheduler), reported to the scheduler
    as a miss with the next lease asked for."""
    url, digest, gate = manager
    config = client.ClientConfig(["http://127.0.0.1:9"], FN_TOKEN, max_batch=1, leases=True)  # no scheduler
    model = client.RemoteModel(torch.nn.Identity(), config)
    model._digest = digest
    now = time.monotonic()
    model._lease = client.HeldLease(url, "cpu-0", _lease(digest), now + 60, now + 60)
    with ThreadPoolExecutor(4) as pool:
        busy = _hold_the_unit(url, digest, pool)
        t0 = time.monotonic()
        late = pool.submit(model._run, torch.ones(1, 2), BatchClass("strict", 100.0, t0, None))
        time.sleep(0.4)
        gate.set()
        assert busy.result().status_code == 200
        with pytest.raises(client.RemoteError) as missed:
            late.result()
    assert missed.value.status == 504 and "missed its deadline" in str(missed.value)
    assert _Counted.ran == 1
    assert model._unreported == [[1, 504, 0.0, True, ""]]  # told to the scheduler as a miss
