"""PROTEAN's procurement live: cordons in a real datastore (embedded and etcd), a real Scheduler
that stops placing on cordoned nodes, and the procurement daemon driving the pure policy with the
emulated cloud (spot first, on-demand when spot fails, cost accounted).

GPU Managers are stood in for by their unit reports (what a manager writes into the datastore)
and, for placement, by a small HTTP server that answers the job API and records each call.
"""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from faas_gpu.cordon import CORDON_PREFIX, cordon, cordoned_nodes, uncordon
from faas_gpu.datastore import open_datastore
from gpu_manager.daemon import STATUS_PREFIX
from gpu_manager.model_store import ModelStore
from scheduler.core import Scheduler


@pytest.fixture(params=["embedded", "etcd"])
def ds(request, tmp_path):
    if request.param == "embedded":
        store = open_datastore(None, tmp_path / "state.db")
    else:
        store = open_datastore(request.getfixturevalue("etcd_server").url)
    for prefix in (STATUS_PREFIX, CORDON_PREFIX):  # etcd is shared by the whole session
        store.delete_prefix(prefix)
    yield store
    for prefix in (STATUS_PREFIX, CORDON_PREFIX):
        store.delete_prefix(prefix)
    store.close()


class FakeManagers:
    """The GPU Manager job API on one port for every node; records (node, unit) of each job."""

    def __init__(self):
        calls = self.calls = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                parts = urlsplit(self.path)
                node = parts.path.split("/")[1]
                calls.append((node, parse_qs(parts.query)["unit"][0]))
                self.send_response(200)
                self.send_header("X-Faas-Gpu-Cache", "hit")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{node}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def report(ds, node: str, url: str, units=("0",), state: str = "idle") -> None:
    """What a GPU Manager's status reporter writes for each of its units."""
    for unit in units:
        body = {"unit": unit, "node": node, "url": url, "memory_mb": 1024.0, "state": state}
        ds.put(f"{STATUS_PREFIX}{node}/{unit}", json.dumps(body))


def artifact() -> bytes:
    """Bytes the model store accepts (a torch.save archive's layout), without torch."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("m/data.pkl", b"\x80\x04N.")
    return buf.getvalue()


def wait_for(predicate, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def scheduler(ds, tmp_path):
    managers = FakeManagers()
    sched = Scheduler(ds, ModelStore(tmp_path / "models"), "token")
    sched.managers = managers
    sched.digest = sched.store.put(artifact()).digest
    yield sched
    sched.close()
    managers.close()


def run_jobs(sched: Scheduler, n: int) -> list[int]:
    jobs = [sched.submit(sched.digest, b"x") for _ in range(n)]
    for job in jobs:
        assert job.done.wait(30), "job not answered"
    return [job.outcome.status for job in jobs]


def test_cordon_keys_round_trip_and_refuse_a_bad_node_name(ds):
    cordon(ds, "spot-1", "eviction notice", evictAt=12.5)
    assert cordoned_nodes(ds)["spot-1"]["reason"] == "eviction notice"
    assert cordoned_nodes(ds)["spot-1"]["evictAt"] == 12.5
    uncordon(ds, "spot-1")
    assert cordoned_nodes(ds) == {}
    with pytest.raises(ValueError, match="node"):
        cordon(ds, "a/b", "x")


def test_the_scheduler_stops_placing_on_a_cordoned_node(ds, scheduler):
    m = scheduler.managers
    report(ds, "spot-1", m.url("spot-1"), units=("0", "1"))
    report(ds, "spot-2", m.url("spot-2"), units=("0", "1"))
    scheduler.start()
    scheduler.refresh_units()
    assert run_jobs(scheduler, 8) == [200] * 8
    assert {node for node, _ in m.calls} == {"spot-1", "spot-2"}

    cordon(ds, "spot-1", "eviction notice")
    scheduler.refresh_units()
    m.calls.clear()
    assert run_jobs(scheduler, 8) == [200] * 8
    assert {node for node, _ in m.calls} == {"spot-2"}

    uncordon(ds, "spot-1")  # e.g. a notice withdrawn: placement may use its units again
    scheduler.refresh_units()
    assert {u.node for u in scheduler._units} == {"spot-1", "spot-2"}


def test_jobs_wait_while_every_node_is_cordoned_and_run_on_the_replacement(ds, scheduler):
    m = scheduler.managers
    report(ds, "spot-1", m.url("spot-1"))
    scheduler.start()
    scheduler.refresh_units()
    cordon(ds, "spot-1", "eviction notice")
    scheduler.refresh_units()
    job = scheduler.submit(scheduler.digest, b"x")
    assert not job.done.wait(0.5)  # nowhere to run: it waits (not on the cordoned node)
    assert m.calls == []
    report(ds, "on-demand-2", m.url("on-demand-2"))
    scheduler.refresh_units()
    assert job.done.wait(30) and job.outcome.status == 200
    assert {node for node, _ in m.calls} == {"on-demand-2"}
