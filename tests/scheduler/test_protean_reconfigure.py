"""PROTEAN's GPU Reconfigurator live (§4.4, Alg. 2): the scheduler's controller re-slices MIG GPUs.

The GPU is a fake A100-40GB at the pynvml boundary (tests/fake_nvml.py) under a real GPU
Manager served over real HTTP; its units reach the scheduler through the datastore, as in a
deployment. The controller is driven tick by tick with the time passed in.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from werkzeug.serving import make_server

from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from faas_gpu.policies.protean.reconfigurator import reconfigurator_from_assumptions
from faas_gpu.policy_data.protean import default_assumptions
from faas_gpu.ports import free_port
from gpu_manager.api import create_app
from gpu_manager.daemon import STATUS_PREFIX, StatusReporter
from gpu_manager.discovery import UnitInfo, discover_units
from gpu_manager.manager import GPUManager
from scheduler.core import Scheduler
from scheduler.gpus import gpu_name_matches, read_gpus
from scheduler.reconfigure import ReconfigController
from scheduler.residency import Residency, ResidencyMeter, resident_counts
from tests.fake_nvml import FakeGPU, MigNVML
from tests.fake_worker import FakeWorker, stored_program

GPU = ("n1", 0)
BE = "resnet50"  # 5 GB a batch: (2g, 1g) holds 2 of them within T_high, 3 and more need a 3g


# -- observation bookkeeping ------------------------------------------------------------------


def test_meter_means_are_time_weighted_over_the_interval():
    m = ResidencyMeter(start=0.0)
    m.sample(0.0, {(GPU, True, BE): 2, (GPU, False, "bert"): 1})
    m.sample(0.5, {(GPU, True, BE): 4})  # from 0.5 on: 4 BE, no strict job
    out = m.means(1.0)
    assert out[GPU] == Residency(best_effort=3.0, strict=0.5, be_model=BE, strict_model="bert")
    # the read starts the next interval; the last counts hold on
    assert m.means(2.0)[GPU] == Residency(4.0, 0.0, BE, None)
    m.sample(2.0, {})
    assert m.means(3.0) == {}


def test_meter_picks_the_model_resident_longest_and_reads_a_zero_span_as_the_counts_now():
    m = ResidencyMeter(start=10.0)
    m.sample(10.0, {(GPU, True, "vgg19"): 1, (GPU, True, BE): 1})
    m.sample(10.2, {(GPU, True, "vgg19"): 1, (GPU, True, BE): 3, (GPU, True, None): 2})
    out = m.means(11.0)[GPU]
    assert out.be_model == BE and out.best_effort == pytest.approx(0.2 * 2 + 0.8 * 6)
    m.sample(11.0, {(GPU, False, "bert"): 2})
    assert m.means(11.0)[GPU] == Residency(0.0, 2.0, None, "bert")


def test_resident_counts_put_running_jobs_on_their_gpu_and_share_queued_ones():
    gpu2 = ("n2", 0)
    unit_gpu = {"n1/MIG-a": GPU, "n1/MIG-b": GPU, "n2/MIG-c": gpu2}
    jobs = [
        ("n1/MIG-a", True, BE),
        ("n1/MIG-b", False, "bert"),
        ("n2/MIG-c", True, BE),
        ("n3/cpu-0", True, BE),  # a unit of no managed GPU: left out
        (None, True, BE),  # queued: half for each GPU
        (None, False, None),
    ]
    out = resident_counts(jobs, unit_gpu, [gpu2, GPU])
    assert out == {
        (GPU, True, BE): 1.5,
        (GPU, False, "bert"): 1.0,
        (gpu2, True, BE): 1.5,
        (GPU, False, None): 0.5,
        (gpu2, False, None): 0.5,
    }
    assert resident_counts([(None, True, BE)], {}, []) == {}


def test_gpu_names_match_the_assumptions_gpu_model():
    assert gpu_name_matches("A100-40GB", "NVIDIA A100-SXM4-40GB")
    assert gpu_name_matches("A100-40GB", "NVIDIA A100-PCIE-40GB")
    assert not gpu_name_matches("A100-40GB", "NVIDIA A100 80GB PCIe")
    assert not gpu_name_matches("A100-40GB", "NVIDIA H100 80GB HBM3")
    assert not gpu_name_matches("A100-40GB", None)


def _report(ds, node, unit, gpu, name, profile, url="http://m", kind="mig"):
    body = {"unit": unit, "kind": kind, "gpu": gpu, "gpu_name": name, "profile": profile}
    ds.put(f"{STATUS_PREFIX}{node}/{unit}", json.dumps({**body, "node": node, "url": url, "memory_mb": 1}))


def test_read_gpus_groups_mig_units_and_leaves_other_gpus_alone(tmp_path):
    ds = open_datastore(None, tmp_path / "state.db")
    a100, h100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"
    for unit, profile in (("MIG-a", "4g.20gb"), ("MIG-b", "2g.10gb"), ("MIG-c", "1g.5gb")):
        _report(ds, "n1", unit, 0, a100, profile)
    _report(ds, "n1", "MIG-d", 1, h100, "3g.40gb")
    _report(ds, "n2", "GPU-x", 0, a100, None, kind="gpu")  # MIG off: not a candidate at all
    _report(ds, "n2", "cpu-0", 0, None, None, kind="cpu")
    _report(ds, "n3", "MIG-e", 0, a100, "4g.20gb")
    _report(ds, "n3", "MIG-f", 0, a100, "4g.20gb")  # two 4g: not a geometry of an A100
    views, skipped = read_gpus(ds, default_assumptions().slowdown.gpu)
    assert list(views) == [GPU]
    v = views[GPU]
    assert v.geometry == ("4g", "2g", "1g") and v.units == ("n1/MIG-a", "n1/MIG-b", "n1/MIG-c") and v.url == "http://m"
    assert "not an A100-40GB" in skipped[("n1", 1)] and "at most 1" in skipped[("n3", 0)]
    assert set(skipped) == {("n1", 1), ("n3", 0)}
    ds.close()


def test_units_report_their_mig_profile_and_gpu_name():
    mig = UnitInfo("MIG-a", "mig", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20096, 0, "GPU-a")
    assert (mig.profile, mig.gpu_name) == ("3g.20gb", "NVIDIA A100-SXM4-40GB")
    whole = UnitInfo("GPU-a", "gpu", "NVIDIA A100-SXM4-40GB", 40960, 0)
    assert (whole.profile, whole.gpu_name) == (None, "NVIDIA A100-SXM4-40GB")
    assert UnitInfo("cpu-0", "cpu", "cpu", 1, 0).profile is None


# -- the controller over a live GPU Manager -------------------------------------------------


class Node:
    """One fake A100 (4g, 2g, 1g) under a GPU Manager on real HTTP, reporting into a datastore,
    and a scheduler (not started: its loop is not needed) over that datastore."""

    def __init__(self, tmp_path, drain_timeout_s: float = 0.3, executor=None, privileged: bool = True):
        self.gpu = FakeGPU.a100_40gb()
        self.nvml = MigNVML([self.gpu], privileged=privileged)
        self.nvml.preset(self.gpu, [("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)])
        self.gate = threading.Event()
        self.manager = GPUManager(
            discover_units(self.nvml),
            ModelStore(tmp_path / "models"),
            worker_factory=lambda a, d, env=None: FakeWorker(a, d, env, self.gate),
            nvml=self.nvml,
        )
        self.digest = stored_program(self.manager.store)
        self.server = make_server("127.0.0.1", free_port(), create_app(self.manager, "t"), threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.ds = open_datastore(None, tmp_path / "state.db")
        self.reporter = StatusReporter(self.manager, self.ds, "n1", self.url)
        self.manager.on_units_changed.append(self.reporter.report)
        self.reporter.report()
        self.now = 0.0
        self.scheduler = Scheduler(self.ds, ModelStore(tmp_path / "sched"), "t", clock=lambda: self.now)
        self.scheduler.refresh_units()
        self.posts: list[int] = []
        http = requests.Session()
        http.hooks["response"].append(lambda r, *a, **k: self.posts.append(r.status_code))
        self.controller = ReconfigController(
            self.scheduler,
            reconfigurator_from_assumptions(default_assumptions()),
            "t",
            drain_timeout_s=drain_timeout_s,
            executor=executor,
            clock=lambda: self.now,
            http=http,
        )

    def tick(self, be_batches: float) -> object:
        """One monitor interval with `be_batches` best-effort resnet50 batches resident all along."""
        self.controller.sample(self.now, {(GPU, True, BE): be_batches})
        self.now += 1.0
        return self.controller.step(self.now)

    def geometry(self) -> list[str]:
        return self.gpu.geometry()

    def scheduler_units(self) -> list[str]:
        return sorted(u.unit for u in self.scheduler._units)

    def unit(self, profile: str) -> str:
        return next(s.info.id for s in self.manager.units.values() if s.info.profile == profile)

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.manager.close()
        self.scheduler.close()
        self.ds.close()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def _run_until_reconfigured(node: Node, be_batches: float, limit: int = 20) -> tuple[int, int]:
    """Ticks until the controller starts a reconfiguration: (ticks whose target differed before it, ticks)."""
    mismatches, posts = 0, len(node.posts)
    for n in range(1, limit + 1):
        current = tuple(k.split(".")[0] for k in node.geometry())
        decision = node.tick(be_batches)
        if decision.reconfigure:
            return mismatches, n
        if decision.targets[GPU] != node.controller.gpu_model.normalize(current):
            mismatches += 1
            assert len(node.posts) == posts, "reconfigured before the wait limit"
    raise AssertionError("never reconfigured")


def test_growing_best_effort_load_reslices_to_4g_3g_and_back_after_the_wait_limit(node):
    for _ in range(3):  # two BE batches fit (2g, 1g): the geometry is right
        assert node.tick(2).targets[GPU] == ("4g", "2g", "1g")
    assert node.posts == [] and node.nvml.log == []
    before = node.scheduler_units()
    mismatches, _ = _run_until_reconfigured(node, 6)  # BE grows past what (2g, 1g) holds
    assert mismatches == 3  # Alg. 2: the same mismatch seen wait_limit (3) times first
    assert node.posts == [200] and node.geometry() == ["4g.20gb", "3g.20gb"]
    after = node.scheduler_units()
    assert after == sorted(node.manager.units) and len(after) == 2 and after != before
    assert node.unit("4g.20gb") in before  # the 4g was kept: the same MIG device
    assert node.scheduler._held == set()
    status = node.controller.status()
    assert status["gpus"]["n1/0"]["geometry"] == ["4g", "3g"] and status["recent"][-1]["status"] == "done"

    assert node.tick(6).reconfigure == []  # the geometry is right now
    mismatches, _ = _run_until_reconfigured(node, 2)  # the load falls back
    assert mismatches == 3
    assert node.posts == [200, 200] and node.geometry() == ["4g.20gb", "2g.10gb", "1g.5gb"]
    assert node.scheduler_units() == sorted(node.manager.units) and len(node.manager.units) == 3


def test_a_refused_reconfiguration_is_tried_again_at_the_next_decision(node):
    for _ in range(2):
        node.tick(2)
    # a job runs on the 1g and does not finish: the GPU cannot drain in time
    job = threading.Thread(target=node.manager.run, args=(node.digest, node.unit("1g.5gb"), b"j"))
    job.start()
    deadline = time.monotonic() + 10
    while node.manager.units[node.unit("1g.5gb")].busy_since is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    _run_until_reconfigured(node, 6)
    assert node.posts == [409] and node.geometry() == ["4g.20gb", "2g.10gb", "1g.5gb"]
    assert node.controller.status()["recent"][-1]["status"] == "refused"
    assert node.controller.status()["gpus"]["n1/0"]["retry"] == ["4g", "3g"]
    assert node.scheduler._held == set() and len(node.scheduler_units()) == 3  # the units serve again
    node.gate.set()
    job.join(10)
    decision = node.tick(6)  # the next decision: no new wait of 3 intervals
    assert decision.reconfigure == [] and node.posts == [409, 200]
    assert node.geometry() == ["4g.20gb", "3g.20gb"]
    assert node.controller.status()["gpus"]["n1/0"]["retry"] is None


def test_a_manager_without_mig_privilege_is_not_retried_and_its_gpu_left_alone(tmp_path):
    """Finding 2: the manager answers 403 before draining; the controller never asks again (each
    attempt would flush nothing, but a retry loop would still be noise) and leaves the GPU alone."""
    node = Node(tmp_path, privileged=False)
    try:
        for _ in range(2):
            node.tick(2)
        before = node.scheduler_units()
        _run_until_reconfigured(node, 6)
        assert node.posts == [403] and node.nvml.log == [] and node.scheduler_units() == before
        status = node.controller.status()
        assert status["recent"][-1]["status"] == "forbidden" and "n1/0" not in status["gpus"]
        assert "may not change MIG geometry (403)" in status["left_alone"]["n1/0"]
        for _ in range(10):
            assert node.tick(6).reconfigure == []
        assert node.posts == [403]
        node.now += node.controller.forbidden_s  # a capability may have been granted since: one more try
        node.controller.refresh()
        assert "n1/0" in node.controller.status()["gpus"]
    finally:
        node.close()


def test_a_destroy_refused_in_use_backs_off_for_the_managers_retry_after(node):
    """Finding 6: NVML refuses a destroy as in use with no process (DCGM): the manager undoes it
    and answers 409 with Retry-After; the controller waits that long before draining again."""
    for _ in range(2):
        node.tick(2)
    held = next(g for g in node.gpu.gis.values() if g.start == 6)
    held.held = True
    _run_until_reconfigured(node, 6)
    assert node.posts == [409] and node.gpu.layout() == [("4g.20gb", 0, 1), ("2g.10gb", 4, 1), ("1g.5gb", 6, 1)]
    assert len(node.scheduler_units()) == 3  # no unit vanished
    not_before = node.controller.status()["gpus"]["n1/0"]["not_before"]
    assert not_before >= node.now + 59
    for _ in range(5):
        node.tick(6)  # Alg. 2 may want it again: the controller holds it back
    assert node.posts == [409] and node.controller.status()["gpus"]["n1/0"]["retry"] == ["4g", "3g"]
    held.held = False
    node.now = not_before
    node.tick(6)
    assert node.posts == [409, 200] and node.geometry() == ["4g.20gb", "3g.20gb"]
    assert node.controller.status()["gpus"]["n1/0"]["not_before"] is None


def test_repeated_refusals_back_off_exponentially():
    from scheduler.reconfigure import ReconfigController

    ctl = ReconfigController.__new__(ReconfigController)
    ctl.interval_s, ctl.max_backoff_s, ctl.forbidden_s = 1.0, 300.0, 3600.0
    ctl._refusals, ctl._not_before, ctl._forbidden = {}, {}, {}
    ctl.clock = lambda: 100.0
    waits = []
    for _ in range(10):
        ctl._after(GPU, "refused", "", True, None)
        waits.append(ctl._not_before[GPU] - 100.0)
    assert waits == [0, 1, 3, 7, 15, 31, 63, 127, 255, 300]
    ctl._after(GPU, "refused", "", True, 60.0)
    assert ctl._not_before[GPU] == 400.0  # the cap, and never before Retry-After
    ctl._after(GPU, "done", "", False, None)
    assert ctl._not_before == {} and ctl._refusals == {}


def test_a_gpu_being_reconfigured_gets_no_job_and_counts_as_busy(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    node = Node(tmp_path, drain_timeout_s=30, executor=pool)
    try:
        job = threading.Thread(target=node.manager.run, args=(node.digest, node.unit("1g.5gb"), b"j"))
        job.start()
        while node.manager.units[node.unit("1g.5gb")].busy_since is None:
            time.sleep(0.01)
        _run_until_reconfigured(node, 6)  # the call waits for the running job to drain
        held = set(node.scheduler._held)
        assert held == {f"n1/{u}" for u in node.manager.units}
        policy = node.scheduler._policy
        assert policy.idle == set()  # held units are busy to the placement policy
        assert node.controller.status()["gpus"]["n1/0"]["reconfiguring"] is True
        while node.ds.get_prefix(STATUS_PREFIX):  # the manager took its draining units out
            time.sleep(0.01)
        observation = node.controller.observations(node.now + 1)
        assert [o.busy for o in observation] == [True]  # Alg. 2 counts it against the 30% cap
        assert node.tick(6).reconfigure == []
        node.gate.set()
        job.join(10)
        pool.shutdown(wait=True)
        assert node.posts == [200] and node.geometry() == ["4g.20gb", "3g.20gb"]
        assert node.scheduler._held == set() and node.scheduler_units() == sorted(node.manager.units)
        assert node.scheduler._policy.idle == {0, 1}
    finally:
        node.close()


def test_a_manager_that_is_down_or_refuses_the_geometry_does_not_stop_the_controller(tmp_path, caplog):
    ds = open_datastore(None, tmp_path / "state.db")
    down = f"http://127.0.0.1:{free_port()}"
    a100 = "NVIDIA A100-SXM4-40GB"
    for unit, profile in (("MIG-a", "4g.20gb"), ("MIG-b", "2g.10gb"), ("MIG-c", "1g.5gb")):
        _report(ds, "n1", unit, 0, a100, profile, url=down)
    now = [0.0]
    sched = Scheduler(ds, ModelStore(tmp_path / "sched"), "t", clock=lambda: now[0])
    ctl = ReconfigController(sched, reconfigurator_from_assumptions(default_assumptions()), "t", clock=lambda: now[0])
    decisions = []
    for _ in range(8):
        ctl.sample(now[0], {(GPU, True, BE): 6})
        now[0] += 1
        decisions.append(ctl.step(now[0]))
    statuses = [o.status for o in ctl.outcomes]
    assert statuses[0] == "unreachable" and len(statuses) >= 2  # and tried again at the next decision
    assert "trying again at the next decision" in caplog.text
    assert sched._held == set()

    class Refuses:
        def post(self, *args, **kwargs):
            r = requests.Response()
            r.status_code, r._content = 400, b'{"error": "invalid MIG geometry"}'
            return r

    ctl.http = Refuses()
    ctl._retry.clear()
    for _ in range(5):
        ctl.sample(now[0], {(GPU, True, BE): 6})
        now[0] += 1
        ctl.step(now[0])
    assert ctl.outcomes[-1].status == "invalid" and ctl.status()["gpus"]["n1/0"]["retry"] is None
    sched.close()
    ds.close()


def test_scheduler_holds_keep_jobs_off_a_unit_until_released(tmp_path):
    ds = open_datastore(None, tmp_path / "state.db")
    for unit in ("MIG-a", "MIG-b"):
        ds.put(
            f"{STATUS_PREFIX}n1/{unit}", json.dumps({"node": "n1", "unit": unit, "url": "http://m", "memory_mb": 100})
        )
    sched = Scheduler(ds, ModelStore(tmp_path / "sched"), "t", clock=lambda: 0.0)
    sched.refresh_units()
    digest = stored_program(sched.store)
    sched.hold_units({"n1/MIG-a"})
    jobs = [sched.submit(digest, b"x", best_effort=True, model=BE) for _ in range(2)]
    with sched._lock:
        sched._admit(0.0)
        sched._apply_holds()
        placed = sched._policy.schedule(0.0)
    assert [sched._units[d.unit].unit for d in placed] == ["MIG-b"]
    for d in placed:
        sched._jobs[d.request.id].unit = sched._units[d.unit].key
    assert sorted(sched.resident_jobs(), key=str) == sorted([("n1/MIG-b", True, BE), (None, True, BE)], key=str)
    sched.release_units({"n1/MIG-a"})
    with sched._lock:
        placed = sched._policy.schedule(0.0)
    assert [sched._units[d.unit].unit for d in placed] == ["MIG-a"] and jobs[1].model == BE
    sched.close()
    ds.close()


def test_the_client_names_its_model_to_the_scheduler():
    from faas_gpu.client import ClientConfig

    env = {"FAAS_GPU_SCHEDULER_URL": "http://s", "FAAS_GPU_MODEL": "resnet-mini"}
    assert ClientConfig.from_env(env).model_name == "resnet-mini"
    assert ClientConfig.from_env({**env, "FAAS_GPU_PROTEAN_MODEL": " resnet50 "}).model_name == "resnet50"
    assert ClientConfig.from_env({"FAAS_GPU_SCHEDULER_URL": "http://s"}).model_name is None


def test_the_loop_acts_only_while_leader_and_reads_the_scheduler_jobs(tmp_path):
    node = Node(tmp_path)
    leader = threading.Event()
    ctl = node.controller
    ctl.is_leader, ctl.interval_s, ctl.sample_s = leader.is_set, 0.05, 0.01
    ctl.clock = time.monotonic
    units = [f"n1/{u}" for u in node.manager.units]
    # six best-effort resnet50 jobs: three queued, three on the GPU's slices
    node.scheduler.resident_jobs = lambda: [(None, True, BE)] * 3 + [(k, True, BE) for k in units]
    try:
        ctl.start()
        time.sleep(0.3)  # many rounds as a follower: nothing observed, nothing asked
        assert node.posts == [] and node.geometry() == ["4g.20gb", "2g.10gb", "1g.5gb"]
        leader.set()
        deadline = time.monotonic() + 20
        # the manager applies the geometry before its answer reaches the controller's response hook
        while node.geometry() != ["4g.20gb", "3g.20gb"] or not node.posts:
            assert time.monotonic() < deadline, node.controller.status()
            time.sleep(0.02)
        assert node.posts[0] == 200
    finally:
        ctl.stop()
        node.close()


def test_the_scheduler_daemon_runs_the_reconfigurator_with_the_flag(tmp_path):
    from tests.daemon_process import Daemon

    home = tmp_path / "home"
    home.mkdir()
    sched = Daemon("scheduler", home, "--reconfigure", "--monitor-interval", "0.5")
    try:
        token = (home / "secrets" / "gpu-manager-token").read_text().strip()
        status = requests.get(f"{sched.url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=5).json()
        assert status["reconfigurator"] == {"gpus": {}, "left_alone": {}, "recent": []}
    finally:
        sched.kill()
    plain = Daemon("scheduler", home)
    try:
        status = requests.get(f"{plain.url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=5).json()
        assert "reconfigurator" not in status
    finally:
        plain.kill()


def test_alg2_sizes_slice_sets_by_what_the_managers_report(node):
    """Finding 7: the live Reconfigurator's thresholds use NVML's slice sizes (4864 MiB for the
    A100's 1g.5gb), the simulator's the nominal ones (5120) where no manager reports."""
    node.controller.refresh()
    r = node.controller.reconfigurator
    assert r.slice_memory_mb == {"4g": 20096.0, "2g": 9856.0, "1g": 4864.0}
    assert r.set_memory_mb(("2g", "1g")) == 9856 + 4864
    assert r.set_memory_mb(("3g",)) == r.gpu.memory_mb("3g") == 20480  # no 3g reports: nominal
