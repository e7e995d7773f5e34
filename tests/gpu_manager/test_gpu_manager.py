"""The GPU Manager's core on the cpu back end: real torch workers, one process per (model, unit)."""

from __future__ import annotations

import io
import os
import signal
import time

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ArtifactError, ModelStore
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager, ModelDoesNotFit, UnknownModel, UnknownUnit
from gpu_manager.worker import ModelInputError, ModelLoadError, Worker
from tests.classify_model import scripted_resnet


@pytest.fixture(scope="module")
def models():
    return [scripted_resnet(seed) for seed in (1, 2, 3)]


@pytest.fixture
def manager(tmp_path, models):
    store = ModelStore(tmp_path / "store")
    digests = [store.put(data).digest for data, _ in models]
    mb = store.get(digests[0]).size / 2**20
    m = GPUManager(cpu_units(2, memory_mb=mb * 2.5), store)  # room for two models per unit
    yield m, digests
    m.close()


def test_job_runs_the_real_model_and_reports_hit_or_miss(manager, models):
    mgr, digests = manager
    x = torch.randn(4, 3, 32, 32)
    first = mgr.run(digests[0], "cpu-0", encode(x))
    assert not first.hit and first.load_s > 0
    expected = models[0][1](x)
    assert torch.allclose(decode(first.payload), expected, atol=1e-5)
    second = mgr.run(digests[0], "cpu-0", encode(x))
    assert second.hit and second.load_s == 0
    assert mgr.status()[0]["models"] == [digests[0]]


def test_lru_eviction_stops_the_victims_worker(manager):
    mgr, digests = manager
    x = encode(torch.randn(1, 3, 32, 32))
    mgr.run(digests[0], "cpu-0", x)
    mgr.run(digests[1], "cpu-0", x)
    old_worker = mgr.workers[(digests[0], "cpu-0")]
    mgr.run(digests[1], "cpu-0", x)  # digests[0] is now least recently used
    mgr.run(digests[2], "cpu-0", x)
    assert (digests[0], "cpu-0") not in mgr.workers and not old_worker.alive
    assert mgr.status()[0]["models"] == [digests[1], digests[2]]


def test_a_worker_killed_mid_job_is_replaced_and_the_job_retried(manager):
    import threading

    mgr, digests = manager
    mgr.run(digests[0], "cpu-1", encode(torch.randn(1, 3, 32, 32)))  # loaded
    worker = mgr.workers[(digests[0], "cpu-1")]
    big = encode(torch.randn(512, 3, 32, 32))  # long enough to be killed in the middle
    out = {}
    job = threading.Thread(target=lambda: out.update(result=mgr.run(digests[0], "cpu-1", big)))
    job.start()
    time.sleep(0.15)
    os.kill(worker.proc.pid, signal.SIGKILL)
    job.join(120)
    result = out["result"]
    assert decode(result.payload).shape == (512, 10) and not result.hit  # retried on a new worker
    assert mgr.workers[(digests[0], "cpu-1")] is not worker and mgr.workers[(digests[0], "cpu-1")].alive


def test_wrong_input_gets_the_models_message_and_the_worker_lives(manager):
    mgr, digests = manager
    with pytest.raises(ModelInputError) as err:
        mgr.run(digests[0], "cpu-0", encode(torch.randn(2, 5, 32, 32)))
    assert "channels" in str(err.value) or "size" in str(err.value)
    assert mgr.run(digests[0], "cpu-0", encode(torch.randn(1, 3, 32, 32))).hit


def test_unknown_model_unit_and_too_big_models(manager, tmp_path, models):
    mgr, digests = manager
    with pytest.raises(UnknownUnit):
        mgr.run(digests[0], "cpu-9", b"")
    with pytest.raises(UnknownModel):
        mgr.run("f" * 64, "cpu-0", b"")
    store = ModelStore(tmp_path / "small")
    digest = store.put(models[0][0]).digest
    tiny = GPUManager(cpu_units(1, memory_mb=0.1), store)
    with pytest.raises(ModelDoesNotFit, match="does not fit unit cpu-0"):
        tiny.run(digest, "cpu-0", encode(torch.randn(1, 3, 32, 32)))


def test_an_artifact_that_will_not_load_is_a_clear_error(tmp_path):
    """A state dict is weights without a model: refused at upload, naming what to send instead."""
    buf = io.BytesIO()
    torch.save({"weights": torch.zeros(3)}, buf)
    with pytest.raises(ArtifactError, match="pickle is refused"):
        ModelStore(tmp_path).put(buf.getvalue())


def test_torchscript_that_writes_files_is_refused_before_its_first_call(tmp_path):
    """aten::save in forward (a file written as root is code run as root): the worker refuses it."""
    from faas_gpu.models import Artifact
    from tests.malicious import SavesAFile, torchscript

    marker = tmp_path / "pwned"
    artifact = ModelStore(tmp_path / "store").put(torchscript(SavesAFile(str(marker))))
    assert artifact.format == "torchscript"  # nothing in the archive says so before it is loaded
    with pytest.raises(ModelLoadError, match="aten::save, which is not allowed"):
        Worker(artifact).start()
    assert not marker.exists()
    # a pickle planted in the store's folder, whatever the caller says it is, is never unpickled
    from tests.malicious import malicious_pickle

    planted = tmp_path / "store" / ("e" * 64 + ".pt")
    planted.write_bytes(malicious_pickle(marker))
    with pytest.raises(ModelLoadError, match="pickle is refused"):
        Worker(Artifact("e" * 64, planted.stat().st_size, "export", planted)).start()
    assert not marker.exists()


def test_a_worker_killed_while_it_loads_is_not_the_callers_error(tmp_path, models):
    """The kernel's OOM killer (SIGKILL) taking a worker mid-load: LoadLost, answered 503 so the
    scheduler places the job again, and the exit named, not the 400 of an artifact that will not load."""
    import threading

    from gpu_manager.api import create_app
    from gpu_manager.worker import LoadLost

    store = ModelStore(tmp_path / "store")
    artifact = store.put(models[0][0])
    worker = Worker(artifact)  # no pool: a fresh process, which imports torch (seconds) before it loads
    failure: list[BaseException] = []

    def start() -> None:
        try:
            worker.start()
        except BaseException as exc:  # noqa: BLE001 — what start raised, for the assertion below
            failure.append(exc)

    starting = threading.Thread(target=start)
    starting.start()
    deadline = time.monotonic() + 30
    while (worker.proc is None or worker.proc.pid is None) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(worker.proc.pid, signal.SIGKILL)
    starting.join(60)
    assert failure and isinstance(failure[0], LoadLost), failure
    assert "SIGKILL" in str(failure[0]) and "OOM killer" in str(failure[0])

    class Killed:  # the manager as the API sees it when a load's worker was lost
        def __getattr__(self, name):
            return getattr(manager, name)

        def run(self, *args, **kwargs):
            raise failure[0]

    manager = GPUManager(cpu_units(1, 64), store)
    try:
        client = create_app(Killed(), "t").test_client()
        r = client.post(
            f"/v1/jobs/{artifact.digest}?unit=cpu-0", data=encode(torch.randn(1, 3, 32, 32)),
            headers={"Authorization": "Bearer t"},
        )  # fmt: skip
        assert r.status_code == 503 and b"died while loading" in r.data
    finally:
        manager.close()
