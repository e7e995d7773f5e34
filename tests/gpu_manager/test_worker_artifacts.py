"""The worker loads only what it checked (issue 41, finding 2): an archive whose hostile entry
torch's reader takes while the check's reader took another is refused by the worker's own check
before torch opens it, even when it reached the store's folder without the store's checks.

Before: the worker checked with Python's zipfile and loaded with torch's reader, so the .pt2 ran
its command in the worker on the first job, and the TorchScript wrote its file (as root) before
the check after loading refused it.
"""

from __future__ import annotations

import hashlib

import pytest

from faas_gpu.models import Artifact
from gpu_manager import loader
from gpu_manager.worker import ModelLoadError, Worker
from tests.malicious import exported_linear, hostile_program, hostile_torchscript


def planted(store, data: bytes, fmt: str) -> Artifact:
    """`data` written straight into the store's folder under its hash: no upload, no store check."""
    store.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    path = store / f"{digest}.pt"
    path.write_bytes(data)
    return Artifact(digest, len(data), fmt, path)


@pytest.mark.parametrize("fmt", ["export", "torchscript"])
def test_a_worker_refuses_an_archive_whose_hostile_entry_only_torch_reads_and_nothing_runs(tmp_path, fmt):
    marker = tmp_path / "pwned"
    data = hostile_program(exported_linear(), marker) if fmt == "export" else hostile_torchscript(marker)
    worker = Worker(planted(tmp_path / "store", data, fmt))
    with pytest.raises(ModelLoadError, match="appears twice"):
        worker.start(timeout_s=120)
    assert not worker.alive
    assert not marker.exists()


@pytest.mark.parametrize("read", [loader.prepare, loader.parse])
def test_the_reads_ahead_refuse_it_too(tmp_path, read):
    """A prepared or pooled worker's read ahead (`loader.prepare`, `loader.parse`) checks the same way."""
    marker = tmp_path / "pwned"
    artifact = planted(tmp_path / "store", hostile_program(exported_linear(), marker), "export")
    with pytest.raises(Exception, match="appears twice"):
        read(str(artifact.path))
    assert not marker.exists()
