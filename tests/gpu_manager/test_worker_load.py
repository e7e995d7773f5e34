"""The worker's load path on the cpu back end: the warm pool, the load split, the whole program
moved to its device (finding 3), and the warm-up batch before ready (finding 9)."""

from __future__ import annotations

import io

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager import loader
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from gpu_manager.pool import WorkerPool
from gpu_manager.worker import Worker, spawn_pooled
from tests.classify_model import scripted_resnet
from tests.waiting import eventually


class Offset(torch.nn.Module):
    """A device burnt into the graph: `arange(..., device='cpu')`, as export records it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.arange(4, device="cpu", dtype=x.dtype)


def exported(model: torch.nn.Module | None = None) -> tuple[bytes, torch.export.ExportedProgram]:
    model = (model or Offset()).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(2, 4),), dynamic_shapes=({0: batch},))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue(), program


@pytest.fixture(scope="module")
def program_bytes() -> bytes:
    return exported()[0]


@pytest.fixture
def store(tmp_path) -> ModelStore:
    return ModelStore(tmp_path / "store")


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(1, 1, spawn_pooled)
    yield p
    p.close()


def test_the_pool_gives_a_ready_worker_and_refills(pool, store, program_bytes):
    pool.refill({}, wait=True)
    assert pool.idle({}) == 1
    assert eventually(lambda: pool.ready({}) == 1)  # torch imported, the export loader warmed
    artifact = store.put(program_bytes)
    worker = Worker(artifact, "cpu", pool=pool)
    try:
        info = worker.start()
        assert info.pooled
        x = torch.randn(3, 4)
        assert decode(worker.run(encode(x))).shape == (3, 4)
        assert eventually(lambda: pool.idle({}) == 1)  # refilled after the load, in the background
    finally:
        worker.stop()


def test_each_unit_environment_has_its_own_pooled_processes(pool, store, program_bytes):
    """CUDA reads CUDA_VISIBLE_DEVICES once, when it starts: a pooled process is spawned with its
    unit's environment, never given another's."""
    a, b = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}
    pool.refill(a, wait=True)
    assert pool.idle(a) == 1 and pool.idle(b) == 0
    artifact = store.put(program_bytes)
    worker_b = Worker(artifact, "cpu", env=b, pool=pool)
    worker_a = Worker(artifact, "cpu", env=a, pool=pool)
    try:
        info_b = worker_b.start()  # none pooled for b: a fresh process with b's environment
        assert not info_b.pooled and info_b.cuda_visible_devices == "GPU-bbbb"
        info_a = worker_a.start()
        assert info_a.pooled and info_a.cuda_visible_devices == "GPU-aaaa"
    finally:
        worker_a.stop()
        worker_b.stop()
        pool.discard(a)
        pool.discard(b)
    assert pool.idle(a) == 0


def test_the_load_split_is_reported(store, program_bytes):
    artifact = store.put(program_bytes)
    worker = Worker(artifact, "cpu")
    try:
        info = worker.start()
    finally:
        worker.stop()
    assert not info.pooled
    assert info.spawn_s > 0 and info.read_s > 0 and info.to_device_s > 0 and info.warmup_s > 0
    assert info.load_s >= info.read_s + info.to_device_s + info.optimize_s + info.warmup_s
    assert info.warmup_skipped is None


def test_move_to_device_rewrites_devices_burnt_into_the_graph():
    """`.module().to(device)` moves parameters only; the pass rewrites the nodes' device kwargs,
    the weights and the example inputs too (finding 3)."""
    _, program = exported()
    assert loader.move_to_device(program, "cpu") is program  # already all on the cpu: the pass is skipped
    burnt = [n for n in program.graph.nodes if "device" in n.kwargs]
    assert burnt and all(str(n.kwargs["device"]) == "cpu" for n in burnt)
    moved = loader.move_to_device(program, "meta")
    nodes = [n for n in moved.graph.nodes if "device" in n.kwargs]
    assert nodes and all(str(n.kwargs["device"]) == "meta" for n in nodes)
    assert all(t.device.type == "meta" for t in moved.state_dict.values())
    args, _ = moved.example_inputs
    assert args[0].device.type == "meta"
    module = moved.module(check_guards=False)
    assert module(torch.randn(2, 4, device="meta")).device.type == "meta"


def test_the_input_check_is_made_once_per_shape_and_a_failing_one_every_time(monkeypatch):
    """torch.export's check of a call's inputs (its forward pre-hook) is remembered per input
    signature (`loader.remember_input_checks`): a shape that passed is not checked again, one
    outside the program's range (batch 65 of at most 64) is refused on every call, as before."""
    from torch.export import _unlift

    _, program = exported()
    model = program.module(check_guards=False)
    assert loader.remember_input_checks(model)
    checked = []
    real = _unlift._check_inputs_match
    monkeypatch.setattr(_unlift, "_check_inputs_match", lambda *a: checked.append(1) or real(*a))
    with torch.inference_mode():
        for _ in range(3):
            model(torch.randn(8, 4))
        assert len(checked) == 1
        model(torch.randn(3, 4))
        assert len(checked) == 2
        for _ in range(2):
            with pytest.raises(RuntimeError, match="64"):
                model(torch.randn(65, 4))
    assert len(checked) == 4
    assert not loader.remember_input_checks(torch.nn.Linear(2, 2))  # no such hook: left as it is


def test_warm_up_runs_before_ready_and_is_not_learnt_as_execution_time(tmp_path, program_bytes):
    store = ModelStore(tmp_path / "store")
    digest = store.put(program_bytes).digest
    mgr = GPUManager(cpu_units(1, memory_mb=64), store)
    try:
        first = mgr.run(digest, "cpu-0", encode(torch.randn(1, 4)))
        info = mgr.workers[(digest, "cpu-0")].info
        assert not first.hit and info.warmup_s > 0 and info.warmup_skipped is None
        assert first.load_split == {
            "spawn": info.spawn_s,
            "read": info.read_s,
            "to_device": info.to_device_s,
            "optimize": info.optimize_s,
            "warmup": info.warmup_s,
        }
        # the execution average starts from the first real batch, not from the warm-up
        assert mgr._exec_s[digest] == pytest.approx(first.execute_s)  # 0.7 x + 0.3 x, not x to the last bit
        assert mgr.status()[0]["estimated_finish_s"] == 0.0
        second = mgr.run(digest, "cpu-0", encode(torch.randn(1, 4)))
        assert second.hit and second.load_split is None
    finally:
        mgr.close()


def test_a_torchscript_archive_skips_warm_up_and_says_why(store):
    data, _ = scripted_resnet(1)
    worker = Worker(store.put(data), "cpu")
    try:
        info = worker.start()
    finally:
        worker.stop()
    assert info.warmup_s == 0.0 and "TorchScript" in info.warmup_skipped


def test_the_manager_keeps_a_warm_worker_per_unit_environment(tmp_path, program_bytes):
    store = ModelStore(tmp_path / "store")
    digest = store.put(program_bytes).digest
    mgr = GPUManager(cpu_units(2, memory_mb=64), store, warm_workers=1)
    try:
        assert eventually(lambda: mgr.pool.idle({}) == 1)  # cpu units share one environment
        assert eventually(lambda: [u["warm_workers"] for u in mgr.status()] == [1, 1])
        mgr.run(digest, "cpu-0", encode(torch.randn(1, 4)))
        assert mgr.workers[(digest, "cpu-0")].info.pooled
    finally:
        mgr.close()
    assert mgr.pool.idle({}) == 0
