"""PROTEAN's procurement live: cordons in a real datastore (embedded and etcd), a real Scheduler
that stops placing on cordoned nodes, and the procurement daemon driving the pure policy with the
emulated cloud (spot first, on-demand when spot fails, cost accounted).

GPU Managers are stood in for by their unit reports (what a manager writes into the datastore)
and, for placement, by a small HTTP server that answers the job API and records each call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from faas_gpu.cloud import EmulatedCloud
from faas_gpu.contract.keys import UNITS as STATUS_PREFIX
from faas_gpu.cordon import CORDON_PREFIX, cordon, cordoned_nodes, uncordon
from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from faas_gpu.paths import REPO_ROOT
from faas_gpu.policies.protean import CostMeter, NodeKind, Procurement
from faas_gpu.ports import free_port
from procurer import DEFAULT_SPOT_CSV, UNITS_PREFIX, Procurer, load_prices
from scheduler.core import Scheduler
from tests.fake_worker import program_archive


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
    sched.digest = sched.store.put(program_archive(b"\x80\x04N.")).digest
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


# -- the procurement daemon's loop body over the emulated cloud ---------------------------------
def test_the_daemon_reads_the_units_where_managers_report_them():
    assert UNITS_PREFIX == STATUS_PREFIX


def test_prices_are_cocktails_spot_series_and_on_demand_is_its_mean_over_0_30(tmp_path):
    spot, on_demand = load_prices(DEFAULT_SPOT_CSV)
    assert spot.values[:2] == (0.045, 0.045) and spot.step_s == 60.0
    assert on_demand == pytest.approx(spot.mean / 0.30)
    with pytest.raises(ValueError, match="--spot-prices: cannot read"):
        load_prices(tmp_path / "none.csv")
    with pytest.raises(ValueError, match="no column 'spot9'"):
        load_prices(DEFAULT_SPOT_CSV, "spot9")


@pytest.fixture
def procurer(ds, tmp_path):
    spot, on_demand = load_prices(DEFAULT_SPOT_CSV)
    cloud = EmulatedCloud(
        7,
        1.0,  # every ready spot node gets a notice at each revocation round...
        spot_availability=1.0,
        eviction_interval_s=10.0,  # ...at t = 10, 20, ...
        notice_s=(30.0, 30.0),  # ...evicting it 30 s later
        boot_s=2.0,
        spot_prices=spot,
        on_demand_per_hour=on_demand,
    )
    p = Procurer(
        ds,
        cloud,
        Procurement(1, spot_retry_s=60.0),
        CostMeter(spot, on_demand),
        drain_grace_s=2.0,
        status_path=tmp_path / "procurement.json",
    )
    p.cloud_ = cloud
    return p


def kinds(p: Procurer) -> dict[str, str]:
    return {nid: h.node.kind.value for nid, h in p.nodes.items()}


def test_eviction_notice_cordons_the_node_and_a_replacement_comes_spot_first_then_on_demand(
    ds, procurer, scheduler, tmp_path
):
    p, cloud, m = procurer, procurer.cloud_, scheduler.managers
    p.tick(0)
    assert kinds(p) == {"spot-1": "spot"}  # spot first
    report(ds, "spot-1", m.url("spot-1"), state="busy")  # its GPU Manager is up, running a job
    for t in range(1, 10):
        p.tick(t)
    scheduler.start()
    scheduler.refresh_units()
    assert {u.node for u in scheduler._units} == {"spot-1"}

    cloud.spot_availability = 0.0  # spot capacity runs out
    p.tick(10)  # the notice: cordon, and a spot replacement that fails
    assert cordoned_nodes(ds)["spot-1"]["reason"] == "eviction notice"
    assert cordoned_nodes(ds)["spot-1"]["evictIn"] == 30.0
    assert kinds(p) == {"spot-1": "spot"}
    scheduler.refresh_units()
    assert scheduler._units == []  # nothing new goes to the cordoned node
    p.tick(11)  # spot failed: the backup is on-demand
    assert kinds(p) == {"spot-1": "spot", "on-demand-2": "on-demand"}
    report(ds, "on-demand-2", m.url("on-demand-2"))
    scheduler.refresh_units()
    assert run_jobs(scheduler, 6) == [200] * 6
    assert {node for node, _ in m.calls} == {"on-demand-2"}

    p.tick(12)
    p.tick(13)
    assert "spot-1" in p.nodes  # its running job has not finished: not released
    report(ds, "spot-1", m.url("spot-1"), state="idle")
    p.tick(14)
    assert kinds(p) == {"on-demand-2": "on-demand"}  # drained: released, and gone everywhere
    assert "spot-1" not in cloud.nodes and "spot-1" not in cordoned_nodes(ds)
    assert ds.get_prefix(f"{STATUS_PREFIX}spot-1/") == []

    status = json.loads((tmp_path / "procurement.json").read_text())
    spot, on_demand = p.meter.spot, p.meter.on_demand_per_hour
    assert status["cost"]["dollars"]["spot"] == pytest.approx(spot.integral_hours(0, 14), abs=1e-6)
    assert status["cost"]["dollars"]["on-demand"] == pytest.approx(on_demand * 3 / 3600, abs=1e-6)
    assert status["cost"]["nodeSeconds"] == {"spot": 14.0, "on-demand": 3.0}
    assert status["cost"]["total"] < status["cost"]["onDemandEquivalent"]
    assert status["counts"]["acquired"] == {"spot": 1, "on-demand": 1}
    assert status["counts"]["failed"] == {"spot": 1, "on-demand": 0}
    assert [(e["event"], e.get("node"), e.get("kind")) for e in status["events"]] == [
        ("acquire", "spot-1", "spot"),
        ("notice", "spot-1", None),
        ("cordon", "spot-1", None),
        ("acquire-failed", None, "spot"),
        ("acquire", "on-demand-2", "on-demand"),
        ("release", "spot-1", "spot"),
    ]
    assert [n["id"] for n in status["nodes"]] == ["on-demand-2"]

    # spot is tried again after --spot-retry; once a spot node serves, the on-demand one retires
    cloud.spot_availability = 1.0
    for t in range(15, 72):
        p.tick(t)
    assert kinds(p) == {"on-demand-2": "on-demand", "spot-3": "spot"}
    report(ds, "spot-3", m.url("spot-3"))
    p.tick(72)
    p.tick(73)
    assert cordoned_nodes(ds)["on-demand-2"]["reason"] == "retired: spot is back"
    p.tick(75)
    assert kinds(p) == {"spot-3": "spot"}
    assert p.meter.node_seconds[NodeKind.ON_DEMAND] == pytest.approx(75 - 11)


def test_a_node_evicted_before_it_drains_is_removed(ds, procurer):
    p, m = procurer, FakeManagers()
    try:
        p.tick(0)
        report(ds, "spot-1", m.url("spot-1"), state="busy")
        for t in range(1, 40):
            p.tick(t)
        assert "spot-1" in cordoned_nodes(ds)
        p.tick(40)  # evicted at 10 + 30 s, still busy
        assert "spot-1" not in p.nodes and "spot-1" not in cordoned_nodes(ds)
        assert ds.get_prefix(f"{STATUS_PREFIX}spot-1/") == []
        assert p.status()["counts"]["evicted"] == 1
        assert p.meter.node_seconds[NodeKind.SPOT] >= 40
    finally:
        m.close()


def test_the_daemon_serves_its_status_and_releases_its_nodes_when_stopped(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "procurer",
            "--home",
            str(tmp_path),
            "--nodes",
            "2",
            "--p-rev",
            "0",
            "--boot",
            "0",
            "--no-managers",
            "--period",
            "0.2",
            "--status-port",
            str(port),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        status = wait_for(lambda: _status(port))
        status = wait_for(lambda: (s := _status(port)) and len(s["nodes"]) == 2 and s)
        assert {n["kind"] for n in status["nodes"]} == {"spot"}
        assert status["prices"]["onDemandPerHour"] == pytest.approx(load_prices(DEFAULT_SPOT_CSV)[1])
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 404
        got = _metrics(port)  # the same figures for Prometheus, open on the loopback as /status
        assert got[("faas_gpu_procurement_nodes", (("kind", "spot"), ("state", "ready")))] == 2
        assert got[("faas_gpu_procurement_nodes", (("kind", "on-demand"), ("state", "ready")))] == 0
        assert got[("faas_gpu_procurement_target_nodes", ())] == 2
        assert got[("faas_gpu_procurement_events_total", (("event", "acquired"), ("kind", "spot")))] == 2
        assert got[("faas_gpu_procurement_price_dollars_per_hour", (("kind", "on-demand"),))] == pytest.approx(
            status["prices"]["onDemandPerHour"]
        )
        wait_for(lambda: _metrics(port)[("faas_gpu_procurement_dollars_total", (("kind", "spot"),))] > 0)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, out
    final = json.loads((tmp_path / "procurement.json").read_text())
    assert final["nodes"] == [] and final["counts"]["released"] == 2
    assert final["cost"]["dollars"]["spot"] > 0 and final["cost"]["dollars"]["on-demand"] == 0
    assert "procure: acquire spot-1" in out


def _metrics(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _status(port: int) -> dict | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}/status", timeout=2).json() or None
    except requests.RequestException:
        return None


def test_the_daemon_refuses_a_missing_price_file(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "procurer", "--home", str(tmp_path), "--spot-prices", str(tmp_path / "x.csv")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--spot-prices" in r.stderr
