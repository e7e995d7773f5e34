"""Prepared workers (the pool's host-memory tier): a model read and checked ahead, so its miss
pays only the copy to the device and the warm-up. The tier's rules (budget, LRU, environment,
never during a load) on fake processes; the manager's use of it (on upload, after eviction, the
split, the accounting, a dead one replaced) on real workers of the cpu back end."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe

import pytest
import torch

from faas_gpu.contract.wire import encode
from faas_gpu.models import ModelStore
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from gpu_manager.pool import Pooled, WorkerPool, host_share_mb
from gpu_manager.worker import Worker, spawn_pooled
from tests.gpu_manager.test_worker_load import Offset, exported
from tests.waiting import eventually

# -- the tier's rules, on fake pooled processes ------------------------------------------------


class FakeProc:
    def __init__(self) -> None:
        self.alive, self.pid = True, 0

    def is_alive(self) -> bool:
        return self.alive

    def terminate(self) -> None:
        self.alive = False

    kill = terminate

    def join(self, timeout: float | None = None) -> None:
        pass


class FakeSpawn:
    """spawn(threads, env) -> Pooled whose other end answers a prepare order like a worker:
    ("prepared", (prepare_s, host_mb)) after `delay_s`, host_mb by path."""

    def __init__(self, host_mb: dict[str, float] | None = None, delay_s: float = 0.0):
        self.host_mb, self.delay_s = host_mb or {}, delay_s
        self.orders: list[tuple] = []
        self.procs: list[FakeProc] = []

    def __call__(self, threads: int, env: dict[str, str]) -> Pooled:
        parent, child = Pipe()
        proc = FakeProc()
        self.procs.append(proc)

        def worker() -> None:
            child.send(("warm", None))
            try:
                order = child.recv()
            except (EOFError, OSError):
                return
            self.orders.append(order)
            time.sleep(self.delay_s)
            try:
                child.send(("prepared", (0.01, self.host_mb.get(order[1], 100.0))))
            except OSError:
                pass

        threading.Thread(target=worker, daemon=True).start()
        return Pooled(proc, parent, dict(env))


def test_the_budget_keeps_the_most_recent_prepared_workers():
    spawn = FakeSpawn({"a": 100.0, "b": 100.0, "c": 100.0, "huge": 500.0})
    pool = WorkerPool(0, 1, spawn, budget_mb=250.0)
    try:
        for d in ("a", "b"):
            assert pool.prepare(d, d, "cpu", {}, "cpu-0", wait=True)
        assert not pool.prepare("a", "a", "cpu", {}, "cpu-0", wait=True)  # already there: only touched (LRU)
        pool.prepare("c", "c", "cpu", {}, "cpu-0", wait=True)  # over 250 MB: the least recent goes, b
        assert [d for d, _, _ in pool.prepared()] == ["a", "c"]
        assert pool.prepared_mb() == 200.0
        pool.prepare("huge", "huge", "cpu", {}, "cpu-0", wait=True)  # alone over the budget: everything goes
        assert pool.prepared() == [] and pool.prepared_mb() == 0.0
        assert sum(p.alive for p in spawn.procs) == 0  # each dropped one was stopped
    finally:
        pool.close()


def test_the_tier_is_off_with_a_zero_budget():
    spawn = FakeSpawn()
    pool = WorkerPool(1, 1, spawn, budget_mb=0.0)
    try:
        assert not pool.prepare("a", "a", "cpu", {}, "cpu-0", wait=True)
        assert spawn.orders == [] and pool.prepared() == []
    finally:
        pool.close()


def test_a_prepared_worker_serves_only_its_own_environment_and_device():
    a, b = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}
    pool = WorkerPool(0, 1, FakeSpawn(), budget_mb=1000.0)
    try:
        pool.prepare("m", "m", "cuda:0", a, "GPU-aaaa", wait=True)
        assert pool.take_prepared("m", b, "cuda:0") is None  # another unit's environment: not this one
        assert pool.take_prepared("m", a, "cpu") is None  # prepared for another device
        assert pool.take_prepared("other", a, "cuda:0") is None
        taken = pool.take_prepared("m", a, "cuda:0")
        assert taken is not None and taken.unit == "GPU-aaaa" and taken.pooled.env == a
        assert pool.take_prepared("m", a, "cuda:0") is None  # taken: out of the tier
    finally:
        pool.close()


def test_a_dead_prepared_worker_is_not_handed_out():
    spawn = FakeSpawn()
    pool = WorkerPool(0, 1, spawn, budget_mb=1000.0)
    try:
        pool.prepare("m", "m", "cpu", {}, "cpu-0", wait=True)
        spawn.procs[0].alive = False
        assert pool.prepared() == []
        assert pool.take_prepared("m", {}, "cpu") is None
    finally:
        pool.close()


def test_no_preparation_starts_while_a_load_runs_and_none_blocks_a_job():
    spawn = FakeSpawn(delay_s=0.5)
    pool = WorkerPool(0, 1, spawn, budget_mb=1000.0)
    try:
        with pool.loading():  # a job's load on this node
            pool.prepare("a", "a", "cpu", {}, "cpu-0")
            time.sleep(0.3)
            assert spawn.orders == []  # waiting for the load to end
            t0 = time.perf_counter()
            assert pool.take_prepared("a", {}, "cpu", wait_s=5) is None  # not started: a miss does not wait
            assert time.perf_counter() - t0 < 0.1
        deadline = time.monotonic() + 5
        while not spawn.orders and time.monotonic() < deadline:
            time.sleep(0.01)
        assert spawn.orders == [("prepare", "a", "cpu")]  # started once the load ended
        t0 = time.perf_counter()
        assert pool.take_prepared("b", {}, "cpu", wait_s=5) is None  # another model's miss: no wait
        assert time.perf_counter() - t0 < 0.1
        # the same model's miss waits for the preparation under way (it read the file first)
        assert pool.take_prepared("a", {}, "cpu", wait_s=5) is not None
    finally:
        pool.close()


def test_a_preparation_no_longer_wanted_is_skipped():
    spawn = FakeSpawn()
    pool = WorkerPool(0, 1, spawn, budget_mb=1000.0)
    try:
        assert pool.prepare("a", "a", "cpu", {}, "cpu-0", wait=True, wanted=lambda: False)
        assert spawn.orders == [] and pool.prepared() == []
    finally:
        pool.close()


def test_the_default_budget_is_a_share_of_the_nodes_memory(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:  1 kB\n")
    assert host_share_mb(0.25, str(meminfo)) == 0.25 * 16384000 / 1024
    assert host_share_mb(0.25, str(tmp_path / "absent")) == 0.0


# -- the manager, on real workers of the cpu back end -------------------------------------------


class Other(Offset):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * 2


def test_an_uploaded_model_is_prepared_and_its_miss_reads_nothing(tmp_path):
    store = ModelStore(tmp_path / "store")
    artifact = store.put(exported()[0])
    mgr = GPUManager(cpu_units(2, memory_mb=64), store, prepared_mb=4096, charge_measured_cpu=True)
    try:
        t0 = time.perf_counter()
        assert mgr.uploaded(artifact)
        assert time.perf_counter() - t0 < 0.5  # ordered, not done, on the upload's path
        # cpu units share one environment: either unit's miss would take it
        assert eventually(lambda: [u["prepared"] for u in mgr.status()] == [[artifact.digest]] * 2)
        assert [u["used_mb"] for u in mgr.status()] == [0.0, 0.0]  # no device memory: charged to no unit
        assert mgr.pool.prepared_mb() > 0  # its host memory, measured, counts against the budget
        result = mgr.run(artifact.digest, "cpu-1", encode(torch.randn(2, 4)))
        info = mgr.workers[(artifact.digest, "cpu-1")].info
        assert not result.hit and info.prepared and info.pooled
        split = result.load_split
        assert split["read"] == 0.0 and split["warmup"] > 0 and split["to_device"] >= 0
        assert split["prepare"] > 0 and split["prepared_ahead"] > 0 and split["spawn"] < 1.0
        assert mgr.status()[1]["prepared"] == []  # taken
        # charged as a load from the store would be: what it measured, in the unit's used memory
        unit = mgr.status()[1]
        assert unit["used_mb"] == result.model_mb == unit["model_mb"][artifact.digest] > 0
        assert mgr.status()[0]["used_mb"] == 0.0
    finally:
        mgr.close()


def test_an_evicted_model_is_prepared_again_and_served_from_it(tmp_path):
    store = ModelStore(tmp_path / "store")
    a, b = store.put(exported()[0]), store.put(exported(Other())[0])
    mgr = GPUManager(cpu_units(1, memory_mb=64), store, prepared_mb=4096, max_workers_per_unit=1)
    try:
        x = encode(torch.randn(1, 4))
        first = mgr.run(a.digest, "cpu-0", x)
        assert "prepare" not in first.load_split  # nothing prepared: a load from the store
        mgr.run(b.digest, "cpu-0", x)  # evicts a (one worker per unit here): a prepared again, after the load
        assert eventually(lambda: mgr.status()[0]["prepared"] == [a.digest])
        back = mgr.run(a.digest, "cpu-0", x)  # evicts b, which is prepared again in its turn
        assert not back.hit and back.load_split["read"] == 0.0 and back.load_split["prepare"] > 0
        assert mgr.status()[0]["models"] == [a.digest]
        assert eventually(lambda: mgr.status()[0]["prepared"] == [b.digest])
    finally:
        mgr.close()


@pytest.fixture
def prepared_pool(tmp_path):
    """An export program in a store and a pool holding it prepared for the cpu unit."""
    artifact = ModelStore(tmp_path / "store").put(exported()[0])
    pool = WorkerPool(0, 1, spawn_pooled, 4096)
    try:
        assert pool.prepare(artifact.digest, str(artifact.path), "cpu", {}, "cpu-0", wait=True)
        yield artifact, pool
    finally:
        pool.close()


def test_a_prepared_worker_that_died_is_replaced_by_a_load_from_the_store(prepared_pool):
    artifact, pool = prepared_pool
    (_, _, prepared), *_ = pool.prepared()
    prepared.pooled.proc.kill()
    prepared.pooled.proc.join()
    worker = Worker(artifact, "cpu", pool=pool)
    try:
        info = worker.start()
        assert not info.prepared and info.read_s > 0  # read from the store, as without the tier
    finally:
        worker.stop()


def test_a_prepared_worker_dying_during_its_load_falls_back_to_the_store(prepared_pool):
    """It died after it was handed the load order: the miss loads from the store once more."""
    artifact, pool = prepared_pool
    original = pool.take_prepared

    def take_and_kill(*args, **kwargs):
        prepared = original(*args, **kwargs)
        prepared.pooled.conn.send = lambda *_: prepared.pooled.proc.kill()  # dies on the load order
        return prepared

    pool.take_prepared = take_and_kill
    worker = Worker(artifact, "cpu", pool=pool)
    try:
        info = worker.start()
        assert not info.prepared and info.read_s > 0
        assert worker.run(encode(torch.randn(1, 4)))
    finally:
        worker.stop()


def test_a_put_of_the_model_prepares_it_and_a_failure_to_do_so_keeps_the_upload(tmp_path):
    from gpu_manager.api import create_app

    store = ModelStore(tmp_path / "store")
    mgr = GPUManager(cpu_units(1, memory_mb=64), store, prepared_mb=4096)
    ordered: list[str] = []
    mgr.uploaded = lambda artifact: ordered.append(artifact.digest)  # the order, not the preparation
    client = create_app(mgr, "tok").test_client()
    try:
        r = client.put("/v1/models", data=exported()[0], headers={"Authorization": "Bearer tok"})
        assert r.status_code == 201 and ordered == [r.get_json()["digest"]]

        def broken(artifact):
            raise RuntimeError("no")

        mgr.uploaded = broken
        r = client.put("/v1/models", data=exported(Other())[0], headers={"Authorization": "Bearer tok"})
        assert r.status_code == 201
    finally:
        mgr.close()


def test_finish_moves_a_prepared_program_whole_to_another_device(tmp_path):
    """The GPU's branch of `finish`, on the meta device: the device pass, the module rebuilt from
    the moved program, the example inputs moved; the read was all done by `prepare`."""
    from gpu_manager import loader

    store = ModelStore(tmp_path / "store")
    artifact = store.put(exported()[0])
    prepared = loader.prepare(str(artifact.path))
    assert prepared.fmt == "export" and prepared.read_s > 0
    assert prepared.module(torch.randn(2, 4)).shape == (2, 4)  # checked and usable on the cpu already
    loaded = loader.finish(prepared, "meta")
    assert loaded.read_s == 0.0 and loaded.to_device_s > 0
    assert loaded.example[0].device.type == "meta"
    assert loaded.model(torch.randn(3, 4, device="meta")).device.type == "meta"
    assert prepared.program is None  # the host copies go with the miss


def test_a_prepared_torchscript_archive_is_served(tmp_path):
    from gpu_manager import loader
    from tests.classify_model import scripted_resnet

    store = ModelStore(tmp_path / "store")
    artifact = store.put(scripted_resnet(1)[0])
    loaded = loader.finish(loader.prepare(str(artifact.path)), "cpu")
    assert loaded.fmt == "torchscript" and loaded.read_s == 0.0 and loaded.example is None


def _gpu_manager(tmp_path, **kwargs) -> tuple[GPUManager, FakeSpawn]:
    """Two GPU units (no NVML: the environments only) whose pool prepares on fake processes."""
    from gpu_manager.discovery import UnitInfo

    units = [UnitInfo(f"GPU-{i}", "gpu", "NVIDIA H100", 80_000, i) for i in range(2)]
    mgr = GPUManager(units, ModelStore(tmp_path / "store"), prepared_mb=4096, **kwargs)
    spawn = FakeSpawn()
    mgr.pool.close()
    mgr.pool = WorkerPool(0, 1, spawn, budget_mb=4096)
    return mgr, spawn


def test_an_upload_is_prepared_for_the_least_loaded_unit_only(tmp_path):
    mgr, spawn = _gpu_manager(tmp_path)
    try:
        mgr.units["GPU-0"].cache.load("other", 1000)  # GPU-1 is the emptier
        artifact = mgr.store.put(exported()[0])
        assert mgr.uploaded(artifact)
        assert eventually(lambda: [u["prepared"] for u in mgr.status()] == [[], [artifact.digest]])
        ((_, env, prepared),) = mgr.pool.prepared()
        assert env == {"CUDA_VISIBLE_DEVICES": "GPU-1"} and prepared.device == "cuda:0"
        assert [u["used_mb"] for u in mgr.status()] == [1000, 0]  # no unit charged for it
    finally:
        mgr.close()


def test_a_unit_stopped_for_a_reconfiguration_drops_its_prepared_workers(tmp_path):
    mgr, spawn = _gpu_manager(tmp_path)
    try:
        artifact = mgr.store.put(exported()[0])
        for unit in ("GPU-0", "GPU-1"):
            mgr._prepare(mgr.units[unit], artifact.digest)
        assert eventually(lambda: len(mgr.pool.prepared()) == 2)
        mgr._stop_unit(mgr.units["GPU-0"])
        assert [p.unit for _, _, p in mgr.pool.prepared()] == ["GPU-1"]
    finally:
        mgr.close()


def test_under_mps_nothing_is_prepared_for_a_unit_whose_daemon_is_not_running(tmp_path):
    class NoDaemons:
        daemons: dict = {}

        def stop_all(self) -> None:
            pass

    mgr, spawn = _gpu_manager(tmp_path, mps=NoDaemons())
    try:
        artifact = mgr.store.put(exported()[0])
        assert not mgr.uploaded(artifact)  # a preparation never starts an MPS daemon
        assert spawn.orders == []
    finally:
        mgr.close()
