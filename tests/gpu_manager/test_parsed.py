"""Programs parsed ahead by pooled workers, their weights bound from the store at the miss
(`loader.parse`/`fill`, `weights.py`, `WorkerPool.remember`): the same model as torch's whole
load, no copy of mapped weights on the cpu, copies where the program writes, refusals that fall
back to the whole load, and the pool's parsing never making a miss slower than a spawn."""

from __future__ import annotations

import io
import threading

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager import loader, weights
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from gpu_manager.pool import WorkerPool
from gpu_manager.worker import Worker, spawn_pooled
from tests.gpu_manager.test_worker_load import Offset, exported
from tests.waiting import eventually


class Tied(torch.nn.Module):
    """Two layers sharing one weight: one record in the archive, two names in the module."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.b = torch.nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class Counter(torch.nn.Module):
    """A program that writes its own buffer at every call (`buffers_to_mutate`)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x) + self.calls


def _stored(tmp_path, model: torch.nn.Module) -> str:
    data, _ = exported(model)
    return str(ModelStore(tmp_path / "store").put(data).path)


def _out(model, x):
    with torch.inference_mode():
        return model(x)


def test_a_filled_skeleton_computes_what_torchs_whole_load_does(tmp_path):
    path = _stored(tmp_path, Offset())
    skeleton = loader.parse(path)
    assert all(t.device.type == "meta" for t in skeleton.module.parameters())  # no weights held ahead
    filled = loader.fill(skeleton, "cpu")
    whole = loader.load(path, "cpu")
    x = torch.randn(3, 4)
    assert filled.parsed and not whole.parsed
    assert torch.equal(_out(filled.model, x), _out(whole.model, x))
    assert filled.example is not None and loader.warm_up(filled, "cpu").warmup_skipped is None


def test_weights_are_mapped_from_the_store_not_copied_on_the_cpu(tmp_path):
    path = _stored(tmp_path, Offset())
    filled = loader.fill(loader.parse(path), "cpu")
    weight = filled.model.lin.weight
    mapped = weights.MappedArchive(path)
    where = weights.members(path)
    member = next(m for m in where if m.endswith("weight_0"))
    record = mapped.record(where, member)
    assert torch.equal(record.view(torch.float32)[: weight.numel()].view_as(weight), weight.detach())
    with open("/proc/self/maps") as fh:  # the weight's page is a mapping of the store's file
        maps = [line for line in fh if path in line]
    address = weight.data_ptr()
    assert any(int(a, 16) <= address < int(b, 16) for a, b in (line.split()[0].split("-") for line in maps))


def test_tensors_sharing_a_record_still_share_after_the_fill(tmp_path):
    filled = loader.fill(loader.parse(_stored(tmp_path, Tied())), "cpu")
    assert filled.model.a.weight.data_ptr() == filled.model.b.weight.data_ptr()


def test_a_buffer_the_program_writes_is_its_own_copy_and_written(tmp_path):
    path = _stored(tmp_path, Counter())
    skeleton = loader.parse(path)
    assert [s.name for s in skeleton.slots if s.private] == ["calls"]
    filled = loader.fill(skeleton, "cpu")
    x = torch.zeros(1, 4)
    first, second = _out(filled.model, x), _out(filled.model, x)  # a write into the mapping would kill the process
    assert torch.allclose(second - first, torch.ones_like(first))
    with open(path, "rb") as fh:  # the store's file is untouched
        assert fh.read() == open(path, "rb").read()


def test_a_torchscript_archive_is_not_parsed_ahead(tmp_path):
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buf)
    path = str(ModelStore(tmp_path / "store").put(buf.getvalue()).path)
    with pytest.raises(weights.Unplannable, match="torchscript"):
        loader.parse(path)


def test_a_plan_that_reads_other_bytes_than_torch_is_refused(tmp_path, monkeypatch):
    path = _stored(tmp_path, Offset())
    real = weights.members

    def shifted(p):
        return {m: (off + 4, size) for m, (off, size) in real(p).items()}

    monkeypatch.setattr(weights, "members", shifted)
    with pytest.raises(weights.Unplannable, match="not torch's tensor"):
        loader.parse(path)


def test_the_chunked_copy_moves_every_byte_through_alternating_buffers():
    src = torch.randint(0, 255, (1000,), dtype=torch.uint8)
    dst = torch.zeros(1000, dtype=torch.uint8)
    buffers = [torch.empty(64, dtype=torch.uint8) for _ in range(2)]
    weights.copy_chunked(src, dst, buffers, None, [False, False])
    assert torch.equal(src, dst)


def test_a_fill_to_another_device_moves_the_weights_and_the_graphs_devices(tmp_path):
    """The non-cpu path on the meta device (no GPU here): records copied per record, the devices
    burnt into the graph (`arange(..., device='cpu')`) moved, the example input with them."""
    filled = loader.fill(loader.parse(_stored(tmp_path, Offset())), "meta")
    assert {t.device.type for t in filled.model.parameters()} == {"meta"}
    devices = {str(n.kwargs["device"]) for n in filled.model.graph.nodes if n.kwargs.get("device") is not None}
    assert devices == {"meta"}
    assert filled.example[0].device.type == "meta"
    assert _out(filled.model, torch.empty(2, 4, device="meta")).device.type == "meta"


# -- the pool -------------------------------------------------------------------------------------


@pytest.fixture
def pool():
    p = WorkerPool(1, 1, spawn_pooled)
    yield p
    p.close()


def test_a_miss_on_a_remembered_program_binds_only_its_weights(tmp_path, pool):
    artifact = ModelStore(tmp_path / "store").put(exported()[0])
    pool.refill({}, wait=True)
    assert pool.remember(str(artifact.path), {}, wait=True)
    assert pool.parsed({}) == {str(artifact.path)} and pool.parsed_count == 1
    worker = Worker(artifact, "cpu", 1, pool=pool)
    info = worker.start()
    try:
        assert info.pooled and info.parsed and info.parse_s > 0
        x = torch.randn(2, 4)
        assert torch.allclose(decode(worker.run(encode(x))), _out(Offset().eval(), x), atol=10)  # it serves
    finally:
        worker.stop()
    assert eventually(lambda: pool.parsed({}) == {str(artifact.path)})  # the replacement parsed it again


def test_a_program_that_cannot_be_parsed_is_loaded_whole_and_not_asked_again(tmp_path, pool):
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buf)
    artifact = ModelStore(tmp_path / "store").put(buf.getvalue())
    pool.refill({}, wait=True)
    assert pool.remember(str(artifact.path), {}, wait=True)
    assert pool.parsed({}) == set() and pool.idle({}) == 1  # the process is kept
    assert not pool.remember(str(artifact.path), {})  # known: the same file, the same answer
    worker = Worker(artifact, "cpu", 1, pool=pool)
    try:
        assert not worker.start().parsed
    finally:
        worker.stop()


def test_a_miss_during_a_parse_waits_for_that_process_rather_than_spawn(tmp_path):
    """The only idle process is out of the pool while it parses: the miss takes it when it comes back."""
    spawned = []

    def spawn(threads, env):
        spawned.append(1)
        return spawn_pooled(threads, env)

    pool = WorkerPool(1, 1, spawn)
    try:
        store = ModelStore(tmp_path / "store")
        a = store.put(exported()[0])
        # 300 layers: a parse of ~1 s here, long enough to be seen under way (a small program's takes ~30 ms)
        b = store.put(exported(torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(300)]))[0])
        pool.refill({}, wait=True)
        assert eventually(lambda: pool.ready({}) == 1)
        pool.remember(str(b.path), {})
        assert eventually(lambda: pool._busy.get((), 0) == 1, 30)  # parsing b
        taken = []
        t = threading.Thread(target=lambda: taken.append(pool.take({}, str(a.path))))
        t.start()
        t.join(60)
        assert taken and taken[0] is not None and str(b.path) in taken[0].parsed
        assert len(spawned) == 1
        from gpu_manager.pool import stop

        stop(taken[0])
    finally:
        pool.close()


def test_the_manager_lists_a_models_program_parsed_after_its_upload(tmp_path):
    store = ModelStore(tmp_path / "store")
    mgr = GPUManager(cpu_units(1, 256), store, warm_workers=1)
    try:
        artifact = store.put(exported()[0])
        mgr.uploaded(artifact)
        assert eventually(lambda: mgr.status()[0]["parsed"] == [artifact.digest])
        assert eventually(lambda: mgr.status()[0]["warm_workers"] == 1)
        result = mgr.run(artifact.digest, "cpu-0", encode(torch.randn(1, 4)))
        assert not result.hit and result.load_split["parse"] > 0  # the miss bound the parsed program
    finally:
        mgr.close()


class _DiesOnParse:
    """spawn(threads, env) -> Pooled whose process parses every program but `deadly`, on which it dies."""

    def __init__(self, deadly: str):
        from tests.gpu_manager.test_prepared import FakeProc

        self.deadly, self.procs, self.asked = deadly, [], []
        self._proc = FakeProc

    def __call__(self, threads, env):
        from multiprocessing import Pipe

        from gpu_manager.pool import Pooled

        parent, child = Pipe()
        proc = self._proc()
        self.procs.append(proc)

        def serve() -> None:
            child.send(("warm", None))
            while True:
                try:
                    order = child.recv()
                except (EOFError, OSError):
                    return
                self.asked.append(order[1])
                if order[1] == self.deadly:
                    proc.alive = False
                    child.close()  # as a process torch's deserializer crashed
                    return
                child.send(("parsed", (True, 0.01)))

        threading.Thread(target=serve, daemon=True).start()
        return Pooled(proc, parent, dict(env))


def test_a_program_whose_parse_kills_the_process_is_never_parsed_ahead_again():
    spawn = _DiesOnParse("deadly")
    pool = WorkerPool(1, 1, spawn)
    try:
        pool.refill({}, wait=True)
        pool.remember("fine", {}, wait=True)
        pool.remember("deadly", {}, wait=True)  # kills the process: replaced, and the program noted
        assert len(spawn.procs) == 2 and pool.idle({}) == 1
        assert not pool.remember("deadly", {})  # never again: no respawn loop on a crashing artifact
        assert eventually(lambda: pool.parsed({}) == {"fine"}, 10)  # the replacement parsed the rest
        assert spawn.asked.count("deadly") == 1
    finally:
        pool.close()
