"""Memory accounting on a fake NVML that reports per-process memory as the real one does
(issue 19, findings 1, 4, 5): measured cost charged to the cache, OOM evicts and retries (507/503,
never 400), device faults replace the worker (under MPS the unit's daemon and workers), and the
worker cap per unit."""

from __future__ import annotations

import itertools
import threading
from multiprocessing import Pipe
from types import SimpleNamespace

import pytest
import torch

from faas_gpu.contract import headers as h
from faas_gpu.contract.wire import encode
from faas_gpu.models import ModelStore
from faas_gpu.policies import ModelCache
from gpu_manager import faults
from gpu_manager.api import create_app
from gpu_manager.discovery import UnitInfo, cpu_units
from gpu_manager.manager import (
    BatchDoesNotFit,
    DeviceMemoryBusy,
    GPUManager,
    ModelDoesNotFit,
    mps_client_cap,
)
from gpu_manager.memory import CUDA_CONTEXT_MB, WorkerMeter, nvml_process_mb
from gpu_manager.worker import DeviceFault, LoadedInfo, OutOfDeviceMemory, _serve_batches
from tests.fake_nvml import GIB, ProcessMemoryNVML
from tests.fake_worker import stored_program

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
CONTEXT_MB = 520.0  # what the fake's processes hold before any tensor (an H100's context is ~500-700)


class CudaLikeWorker:
    """A cuda worker as NVML sees it: a process whose used memory is its context plus what torch's
    allocator reserved (the weights, then the peak of its batches). The device's memory is shared
    by every process on it: a load or a batch that does not fit raises OutOfDeviceMemory, as
    torch.OutOfMemoryError does in a real worker. A payload is the batch's row count; b"fault"
    is a device fault (the worker exits)."""

    pids = itertools.count(41000)

    def __init__(
        self, nvml: ProcessMemoryNVML, device_mb: float, weights_mb: float, act_mb_per_row: float, lazy_mb: float = 0
    ):
        self.nvml, self.device_mb = nvml, device_mb
        self.context_mb, self.lazy_mb = CONTEXT_MB, lazy_mb  # lazy: kernels loaded at the first batch
        self.weights_mb, self.act_mb_per_row = weights_mb, act_mb_per_row
        self.proc = SimpleNamespace(pid=next(self.pids))
        self.info: LoadedInfo | None = None
        self.peak_mb = self.now_mb = 0.0  # torch's reserved memory at its peak and now (it keeps its peak)
        self.alive = False

    def _need(self, extra_mb: float) -> None:
        if self.nvml.used_mb(UUID) + extra_mb > self.device_mb:
            raise OutOfDeviceMemory(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {extra_mb} MiB")

    def start(self, timeout_s: float = 120) -> LoadedInfo:
        self._need(self.context_mb + self.weights_mb)
        self.nvml.run_process(UUID, self.proc.pid, self.context_mb + self.weights_mb)
        self.info, self.alive = LoadedInfo(0, 0.01, self.weights_mb), True
        self.peak_mb = self.now_mb = self.weights_mb
        return self.info

    def run(self, payload: bytes, timeout_s: float = 60) -> bytes:
        if payload == b"fault":
            self.stop()
            raise DeviceFault("AcceleratorError: CUDA error: an illegal memory access was encountered")
        rows = int(payload) if payload.isdigit() else 1  # a wire-format batch from the API: one row
        reserved = self.weights_mb + rows * self.act_mb_per_row
        if reserved > self.peak_mb or self.lazy_mb:
            self._need(reserved - self.peak_mb + self.lazy_mb)
            self.context_mb += self.lazy_mb
            self.peak_mb = self.now_mb = max(reserved, self.peak_mb)
            self.lazy_mb = 0.0
            self.nvml.run_process(UUID, self.proc.pid, self.context_mb + self.peak_mb)
        return b"ok"

    def stop(self) -> None:
        self.alive = False
        self.nvml.end_process(UUID, self.proc.pid)


class SpyMPS:
    """MPSControl's public face (ensure/stop/stop_all), recording what the manager asked for."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def ensure(self, unit: str):
        self.events.append(("ensure", unit))
        return SimpleNamespace(
            client_env=lambda pct=None: {"CUDA_VISIBLE_DEVICES": unit, "CUDA_MPS_PIPE_DIRECTORY": "/p"}
        )

    def stop(self, unit: str) -> None:
        self.events.append(("stop", unit))

    def stop_all(self) -> None:
        self.events.append(("stop_all", ""))


def _setup(
    tmp_path, *, unit_mb: float, device_mb: float, weights: dict[str, float], act: float = 2.0, lazy_mb=0.0, **kw
):
    """A manager over one H100 unit of `unit_mb` on a fake NVML whose device has `device_mb`;
    models by tag with their weights (MB). Returns (manager, nvml, digests by tag, workers made)."""
    nvml = ProcessMemoryNVML([{"uuid": UUID, "name": "NVIDIA H100 80GB HBM3", "mem": int(device_mb) * 2**20}])
    store = ModelStore(tmp_path / "store")
    digests = {tag: stored_program(store, tag) for tag in weights}
    by_digest = {d: weights[t] for t, d in digests.items()}
    made: list[CudaLikeWorker] = []

    def factory(artifact, device, env=None):
        made.append(CudaLikeWorker(nvml, device_mb, by_digest[artifact.digest], act, lazy_mb))
        return made[-1]

    unit = UnitInfo(UUID, "gpu", "NVIDIA H100 80GB HBM3", unit_mb, 0)
    mgr = GPUManager([unit], store, worker_factory=factory, nvml=nvml, **kw)
    return mgr, nvml, digests, made


def test_the_fake_lists_processes_with_their_memory_as_pynvml_does():
    nvml = ProcessMemoryNVML([{"uuid": UUID, "name": "H100", "mem": 80 * GIB}])
    nvml.run_process(UUID, 7, 1234)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    (p,) = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert p.pid == 7 and p.usedGpuMemory == 1234 * 2**20
    assert nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle) == []
    assert nvml_process_mb(nvml, handle, 7) == 1234 and nvml_process_mb(nvml, handle, 8) is None
    mps = ProcessMemoryNVML([{"uuid": UUID, "name": "H100", "mem": 80 * GIB}], mps=True)
    mps.run_process(UUID, 7, 100)
    mps.run_process(UUID, 9, None)  # NVML_VALUE_NOT_AVAILABLE
    handle = mps.nvmlDeviceGetHandleByIndex(0)
    assert mps.nvmlDeviceGetComputeRunningProcesses(handle) == []  # MPS clients are listed apart
    assert nvml_process_mb(mps, handle, 7) == 100 and nvml_process_mb(mps, handle, 9) is None


def test_a_model_is_charged_its_measured_cost_not_its_file_size(tmp_path):
    mgr, nvml, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=80_000, weights={"a": 1000})
    artifact = mgr.store.get(d["a"])
    assert mgr.cost_mb(artifact, mgr.units[UUID].info) == pytest.approx(mgr.model_mb(artifact) + CUDA_CONTEXT_MB)
    result = mgr.run(d["a"], UUID, b"1")
    pid = made[0].proc.pid
    assert mgr.costs[(d["a"], "gpu:NVIDIA H100 80GB HBM3")] == pytest.approx(CONTEXT_MB + 1002)
    (unit,) = mgr.status()
    assert unit["used_mb"] == pytest.approx(nvml.processes[UUID][pid] / 2**20)  # NVML's own figure
    assert (
        unit["model_mb"] == {d["a"]: pytest.approx(CONTEXT_MB + 1002)} and result.model_mb == unit["model_mb"][d["a"]]
    )
    assert unit["measured_mb"] == unit["model_mb"] and unit["overhead_mb"] == CUDA_CONTEXT_MB
    mgr.run(d["a"], UUID, b"100")  # a larger batch: its activations grow the cost
    assert mgr.status()[0]["used_mb"] == pytest.approx(nvml.processes[UUID][pid] / 2**20) == CONTEXT_MB + 1200
    # the next load of this model on this kind of unit is charged what was measured, not the estimate
    assert mgr.cost_mb(artifact, mgr.units[UUID].info) == pytest.approx(CONTEXT_MB + 1200)


def test_the_context_is_read_again_after_the_first_batch(tmp_path):
    """Lazy module loading (and cuBLAS's handle) grow the context at the first batch, outside torch's allocator."""
    mgr, nvml, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=80_000, weights={"a": 1000}, act=0.0, lazy_mb=150)
    mgr.run(d["a"], UUID, b"1")
    assert mgr.status()[0]["used_mb"] == pytest.approx(nvml.processes[UUID][made[0].proc.pid] / 2**20)
    assert mgr.status()[0]["used_mb"] == pytest.approx(CONTEXT_MB + 150 + 1000)


def test_a_cost_that_grows_past_its_reservation_evicts_the_least_recently_used(tmp_path):
    mgr, _, d, made = _setup(tmp_path, unit_mb=4000, device_mb=80_000, weights={"a": 1000, "b": 1000})
    mgr.run(d["b"], UUID, b"1")
    mgr.run(d["a"], UUID, b"1")
    assert mgr.status()[0]["models"] == [d["b"], d["a"]]  # 2 x ~1522 MB of 4000
    mgr.run(d["a"], UUID, b"600")  # a now costs 520 + 1000 + 1200 = 2720: b must go
    assert mgr.status()[0]["models"] == [d["a"]] and not made[0].alive
    assert mgr.status()[0]["used_mb"] == pytest.approx(2720)


def test_out_of_memory_at_load_evicts_the_others_and_retries(tmp_path):
    # the unit's budget says both fit; the device (NVML) says otherwise: the measured truth wins
    mgr, nvml, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=3000, weights={"a": 1000, "b": 1500})
    mgr.run(d["a"], UUID, b"1")
    result = mgr.run(d["b"], UUID, b"1")
    assert not result.hit and mgr.status()[0]["models"] == [d["b"]] and not made[0].alive
    assert list(nvml.processes[UUID]) == [made[-1].proc.pid]


def test_out_of_memory_alone_is_507_and_memory_held_elsewhere_is_503_never_400(tmp_path):
    mgr, nvml, d, _ = _setup(tmp_path, unit_mb=80_000, device_mb=3000, weights={"big": 5000, "a": 1000})
    with pytest.raises(ModelDoesNotFit):
        mgr.run(d["big"], UUID, b"1")
    client = create_app(mgr, "t").test_client()
    auth = {"Authorization": "Bearer t"}
    body = encode(torch.zeros(1))
    r = client.post(f"/v1/jobs/{d['big']}?unit={UUID}", data=body, headers=auth)
    assert r.status_code == 507, r.text
    # a model measured to fit, out of memory with the unit emptied: someone else holds memory
    mgr.run(d["a"], UUID, b"1")
    mgr._drop((d["a"], UUID), mgr.units[UUID])
    nvml.run_process(UUID, 999, 2600)  # another tenant's process
    with pytest.raises(DeviceMemoryBusy):
        mgr.run(d["a"], UUID, b"1")
    r = client.post(f"/v1/jobs/{d['a']}?unit={UUID}", data=body, headers=auth)
    assert r.status_code == 503, r.text
    nvml.end_process(UUID, 999)
    mgr.run(d["a"], UUID, b"1")  # retried later, it loads
    r = client.post(f"/v1/jobs/{d['a']}?unit={UUID}", data=body, headers=auth)
    assert r.status_code == 200 and float(r.headers[h.MODEL_MB]) == pytest.approx(CONTEXT_MB + 1002, abs=0.1)


def test_a_batch_out_of_memory_evicts_the_others_then_is_507(tmp_path):
    mgr, _, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=4000, weights={"a": 1000, "b": 1000})
    mgr.run(d["b"], UUID, b"1")
    mgr.run(d["a"], UUID, b"1")
    assert mgr.run(d["a"], UUID, b"500").payload == b"ok"  # 1000 MB more: b is evicted, then it fits
    assert mgr.status()[0]["models"] == [d["a"]] and not made[0].alive
    with pytest.raises(BatchDoesNotFit):  # alone, it still does not fit: 507, not the caller's 400
        mgr.run(d["a"], UUID, b"5000")


def test_a_device_fault_replaces_the_worker_and_the_job_is_retried(tmp_path):
    mgr, _, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=80_000, weights={"a": 100, "b": 100})
    mgr.run(d["b"], UUID, b"1")
    mgr.run(d["a"], UUID, b"1")
    with pytest.raises(DeviceFault):  # faults again on its new worker: not retried a third time
        mgr.run(d["a"], UUID, b"fault")
    assert not made[1].alive and made[0].alive  # without MPS the other model's worker is untouched
    assert mgr.run(d["a"], UUID, b"1").hit is False and mgr.workers[(d["a"], UUID)].alive


def test_under_mps_a_device_fault_restarts_the_units_daemon_and_all_its_workers(tmp_path):
    spy = SpyMPS()
    mgr, _, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=80_000, weights={"a": 100, "b": 100}, mps=spy)
    mgr.run(d["b"], UUID, b"1")
    mgr.run(d["a"], UUID, b"1")
    spy.events.clear()

    calls = iter([b"fault", b"1"])
    worker = mgr.workers[(d["a"], UUID)]
    run = worker.run
    worker.run = lambda payload, timeout_s=60: run(next(calls), timeout_s)
    result = mgr.run(d["a"], UUID, b"1")  # the fault, then the retry on a fresh worker and daemon
    assert result.payload == b"ok" and not result.hit
    assert not made[0].alive and not made[1].alive  # b's worker too: a fatal fault poisons every client
    assert spy.events[:2] == [("stop", UUID), ("ensure", UUID)]
    assert mgr.status()[0]["models"] == [d["a"]]


def test_the_mps_client_limit_caps_workers_per_unit():
    def mig(profile):
        return UnitInfo("MIG-x", "mig", f"NVIDIA A100-SXM4-40GB MIG {profile}", 4864, 0, "GPU-x")

    assert mps_client_cap(UnitInfo(UUID, "gpu", "NVIDIA H100", 81559, 0)) == 48
    assert [mps_client_cap(mig(p)) for p in ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")] == [
        6,
        13,
        20,
        27,
        48,
    ]


def test_at_the_cap_a_load_evicts_the_least_recently_used_never_fails(tmp_path):
    spy = SpyMPS()
    weights = {f"m{i}": 10 for i in range(8)}
    mgr, _, d, made = _setup(tmp_path, unit_mb=80_000, device_mb=80_000, weights=weights, mps=spy)
    mgr.units[UUID].info = UnitInfo(UUID, "mig", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 80_000, 0, "GPU-p")
    assert mgr.worker_cap(mgr.units[UUID].info) == 6 and mgr.status()[0]["max_models"] == 6
    for i in range(8):
        mgr.run(d[f"m{i}"], UUID, b"1")
    assert mgr.status()[0]["models"] == [d[f"m{i}"] for i in range(2, 8)]
    assert [w.alive for w in made] == [False, False] + [True] * 6
    capped, _, d2, _ = _setup(tmp_path / "2", unit_mb=80_000, device_mb=80_000, weights=weights, max_workers_per_unit=2)
    for i in range(3):
        capped.run(d2[f"m{i}"], UUID, b"1")
    assert capped.status()[0]["models"] == [d2["m1"], d2["m2"]]


def test_model_cache_resize_evicts_others_least_recently_used_first():
    cache = ModelCache(100)
    cache.load("a", 30)
    cache.load("b", 30)
    cache.load("c", 30)
    assert cache.resize("c", 60) == ["a"] and cache.used_mb == 90
    assert cache.resize("c", 150) == ["b"] and cache.models == ["c"] and cache.used_mb == 150
    assert cache.sizes == {"c": 150}


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), faults.OOM),
        (MemoryError(), faults.OOM),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: not enough memory"), faults.INPUT),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), faults.DEVICE),
        (RuntimeError("CUDA error: device-side assert triggered"), faults.DEVICE),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm"), faults.DEVICE),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"), faults.INPUT),
    ],
)
def test_faults_are_told_apart(exc, kind):
    assert faults.classify(exc) == kind


@pytest.mark.skipif(not hasattr(torch, "AcceleratorError"), reason="torch without AcceleratorError")
def test_accelerator_error_is_a_device_fault():
    exc = torch.AcceleratorError.__new__(torch.AcceleratorError)
    assert faults.classify(exc) == faults.DEVICE


def test_the_serve_loop_exits_on_a_device_fault_and_serves_on_after_oom():
    """The worker's own loop: input error -> `er`, OOM -> `om` and it serves on, device -> `df` and it ends."""
    answers = iter(
        [
            RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
            torch.OutOfMemoryError("CUDA out of memory"),
            None,
            RuntimeError("CUDA error: an illegal memory access was encountered"),
        ]
    )

    def model(x):
        exc = next(answers)
        if exc is not None:
            raise exc
        return x * 2

    parent, child = Pipe()
    loop = threading.Thread(target=_serve_batches, args=(child, model, "cpu", torch, WorkerMeter("cpu", torch)))
    loop.start()
    tags = []
    for _ in range(4):
        parent.send_bytes(encode(torch.ones(2)))
        tags.append(parent.recv_bytes()[:2])
    loop.join(10)
    assert tags == [b"er", b"om", b"ok", b"df"] and not loop.is_alive()


def test_a_cpu_worker_measures_its_model_from_its_process_memory(tmp_path):
    from tests.classify_model import scripted_resnet

    store = ModelStore(tmp_path / "store")
    digest = store.put(scripted_resnet(1)[0]).digest
    mgr = GPUManager(cpu_units(1, memory_mb=2048), store, charge_measured_cpu=True)
    try:
        mgr.run(digest, "cpu-0", encode(torch.randn(1, 3, 32, 32)))
        worker = mgr.workers[(digest, "cpu-0")]
        assert worker.info.process_mb > 50  # the interpreter and torch, apart from the model
        assert worker.info.memory_mb > 0
        loaded = mgr.status()[0]["model_mb"][digest]
        result = mgr.run(digest, "cpu-0", encode(torch.randn(256, 3, 32, 32)))  # a larger batch's activations
        assert result.model_mb >= loaded and mgr.status()[0]["measured_mb"][digest] == result.model_mb
    finally:
        mgr.close()


def test_a_cpu_meter_reads_the_costly_uss_at_most_once_a_second_and_the_peak_four_times(monkeypatch):
    """smaps_rollup costs a torch worker ~3 ms a read: once a batch it was more than the model. The
    peak (the kernel's high-water mark, which a later read still holds) is read at most every
    quarter second, and at once after a batch larger than any before."""
    from gpu_manager import memory

    reads = {"uss": 0, "rss": 0}
    uss = iter(range(100, 10_000, 10))
    hwm = iter(range(500, 10_000, 50))

    def fake_uss(pid="self"):
        reads["uss"] += 1
        return float(next(uss))

    def fake_rss(pid="self"):
        reads["rss"] += 1
        return 400.0, float(next(hwm))

    monkeypatch.setattr(memory, "process_uss_mb", fake_uss)
    monkeypatch.setattr(memory, "process_rss_mb", fake_rss)
    now = [0.0]
    meter = WorkerMeter("cpu", torch, clock=lambda: now[0])  # baseline: USS 100, RSS 400
    first = meter.cost_mb(8)
    for _ in range(20):  # twenty batches of the same size within 0.8 s
        now[0] += 0.04
        later = meter.cost_mb(8)
    assert reads["uss"] == 2 and reads["rss"] == 4  # baseline + one; baseline + at 0 s and twice more
    assert first == (10.0, 150.0) and later[0] == 10.0 and later[1] == 250.0  # the peak keeps up, a little late
    assert meter.cost_mb(16)[1] == 300.0 and reads["rss"] == 5  # a larger batch: read at once
    now[0] += 1.0
    assert meter.cost_mb(8)[0] == 20.0 and reads["uss"] == 3
