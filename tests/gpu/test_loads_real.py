"""Model loads on the real device: the worker's to-device copy against the host-to-device
bandwidth measured here (pageable and pinned), the whole export program moved to the GPU
(finding 3), the warm-up batch on the GPU before ready (finding 9), a pooled worker that
keeps its unit's CUDA_VISIBLE_DEVICES, and a prepared worker (the model read ahead into host
memory, no CUDA context) whose miss is the copy to the device and the warm-up, and a program
parsed ahead whose miss copies its weights from the store's mapping through pinned buffers.
Read-only on the device; figures are printed (`-s`)."""

from __future__ import annotations

import io
import time

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager.pool import WorkerPool, host_share_mb
from gpu_manager.worker import Worker, spawn_pooled

MB = 1e6


def _h2d_gbps(pinned: bool, nbytes: int = 512 * 2**20, repeat: int = 3) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8)
    if pinned:
        host = host.pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=pinned)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=pinned)
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


class Wide(torch.nn.Module):
    """~268 MB of fp32 weights, and a device burnt into the graph (`arange(..., device='cpu')`)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x) + torch.arange(4096, device="cpu", dtype=x.dtype)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    model = Wide().eval()
    batch = torch.export.Dim("batch", min=1, max=256)
    program = torch.export.export(model, (torch.randn(2, 4096),), dynamic_shapes=({0: batch},))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    store = ModelStore(tmp_path_factory.mktemp("store"))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return store.put(buf.getvalue()), model, weight_bytes


def test_host_to_device_bandwidth_pinned_and_pageable():
    pageable, pinned = _h2d_gbps(False), _h2d_gbps(True)
    print(f"host to device: pageable {pageable:.1f} GB/s, pinned {pinned:.1f} GB/s")
    assert pinned > 1 and pageable > 1


def test_an_export_program_loads_whole_onto_the_gpu_warmed_up(wide):
    """The graph's `arange(device='cpu')` is rewritten by move_to_device_pass: without it the
    first batch fails with tensors on two devices."""
    artifact, model, weight_bytes = wide
    worker = Worker(artifact, "cuda:0")
    try:
        info = worker.start()
        x = torch.randn(3, 4096)
        y = decode(worker.run(encode(x)))
    finally:
        worker.stop()
    with torch.inference_mode():
        assert torch.allclose(y, model(x), atol=1e-3)
    assert info.warmup_skipped is None and info.warmup_s > 0
    pageable = _h2d_gbps(False)
    to_device_gbps = weight_bytes / info.to_device_s / 1e9
    print(
        f"load of {weight_bytes / MB:.0f} MB: spawn {info.spawn_s:.3f} s, read {info.read_s:.3f} s, to device "
        f"{info.to_device_s:.3f} s ({to_device_gbps:.1f} GB/s vs pageable {pageable:.1f} GB/s), warm-up "
        f"{info.warmup_s:.3f} s"
    )
    assert to_device_gbps >= 0.25 * pageable  # the copy to the device near the link's own bandwidth


def test_a_pooled_worker_serves_on_its_units_device(wide):
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    env = {"CUDA_VISIBLE_DEVICES": uuid}
    pool = WorkerPool(1, 1, spawn_pooled)
    pool.refill(env, wait=True)
    deadline = time.monotonic() + 120
    while pool.ready(env) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    try:  # an idle pooled worker holds no CUDA context: no memory on the unit until it has a model
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        assert all(p.proc.pid not in pids for p in pool._idle.get(tuple(sorted(env.items())), []))
    finally:
        pynvml.nvmlShutdown()
    artifact, _, _ = wide
    worker = Worker(artifact, "cuda:0", env=env, pool=pool)
    try:
        info = worker.start()
        assert info.pooled and info.cuda_visible_devices == uuid
        assert decode(worker.run(encode(torch.randn(2, 4096)))).shape == (2, 4096)
    finally:
        worker.stop()
        pool.close()


def _gpu_pids(pynvml, handle) -> set[int]:
    """Processes holding a context on the device: compute and MPS clients alike."""
    pids: set[int] = set()
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        try:
            pids |= {p.pid for p in getattr(pynvml, name)(handle)}
        except (pynvml.NVMLError, AttributeError):
            pass
    return pids


def test_a_prepared_miss_is_the_copy_to_the_gpu_and_its_warm_up(wide):
    """Prepared: read and checked in host memory, no CUDA context (NVML lists no process of it);
    its miss: read 0, the device pass and copy at a share of the link's bandwidth, the warm-up."""
    import pynvml

    artifact, model, weight_bytes = wide
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        env = {"CUDA_VISIBLE_DEVICES": uuid}
        pool = WorkerPool(0, 1, spawn_pooled, budget_mb=host_share_mb(0.25))
        assert pool.prepare(artifact.digest, str(artifact.path), "cuda:0", env, uuid, wait=True)
        ((_, _, prepared),) = pool.prepared()
        assert prepared.pooled.proc.pid not in _gpu_pids(pynvml, handle)  # no context while prepared
        assert prepared.host_mb * 2**20 > weight_bytes  # the weights are in its host memory (MiB)
        worker = Worker(artifact, "cuda:0", env=env, pool=pool)
        try:
            info = worker.start()
            x = torch.randn(3, 4096)
            y = decode(worker.run(encode(x)))
        finally:
            worker.stop()
            pool.close()
    finally:
        pynvml.nvmlShutdown()
    with torch.inference_mode():
        assert torch.allclose(y, model(x), atol=1e-3)
    assert info.prepared and info.read_s == 0.0 and info.prepare_s > 0
    assert info.warmup_skipped is None and info.warmup_s > 0
    pageable, pinned = _h2d_gbps(False), _h2d_gbps(True)
    to_device_gbps = weight_bytes / info.to_device_s / 1e9
    print(
        f"prepared miss of {weight_bytes / MB:.0f} MB: prepared {info.prepare_s:.3f} s, "
        f"{info.prepared_ahead_s:.1f} s ahead; hand-over {info.spawn_s:.3f} s, to device {info.to_device_s:.3f} s "
        f"({to_device_gbps:.1f} GB/s vs pageable {pageable:.1f}, pinned {pinned:.1f} GB/s), warm-up "
        f"{info.warmup_s:.3f} s"
    )
    # pageable memory (pinning needs a CUDA context, which a prepared worker must not hold), the
    # device pass and the module rebuilt from the moved program included
    assert to_device_gbps >= 0.25 * pageable


def test_a_parsed_miss_copies_the_weights_through_pinned_buffers_near_the_links_bandwidth(wide):
    """A program parsed ahead (no weights, no CUDA) bound at the miss: each record copied from the
    store's mapping to the GPU through two pinned buffers, the graph's devices moved; the answer
    the same as the whole load's, the copy at a share of the pinned link's bandwidth."""
    from gpu_manager import loader

    artifact, model, weight_bytes = wide
    skeleton = loader.parse(str(artifact.path))
    filled = loader.warm_up(loader.fill(skeleton, "cuda:0"), "cuda:0")
    x = torch.randn(3, 4096)
    with torch.inference_mode():
        y = filled.model(x.to("cuda:0")).cpu()
        assert torch.allclose(y, model(x), atol=1e-3)
    assert filled.parsed and filled.warmup_skipped is None
    pinned = _h2d_gbps(True)
    gbps = weight_bytes / (filled.read_s + filled.to_device_s) / 1e9
    print(
        f"parsed miss of {weight_bytes / MB:.0f} MB: map {filled.read_s:.4f} s, to device {filled.to_device_s:.4f} s "
        f"({gbps:.1f} GB/s vs pinned {pinned:.1f} GB/s), warm-up {filled.warmup_s:.3f} s"
    )
    assert gbps >= 0.25 * pinned
