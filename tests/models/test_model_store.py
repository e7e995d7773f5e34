"""The GPU Manager's model store: content-addressed, size-limited, checked without unpickling."""

from __future__ import annotations

import hashlib
import io
import sys

import pytest
import torch

from faas_gpu.models import ArtifactError, ArtifactTooLarge, ModelStore
from faas_gpu.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402


@pytest.fixture(scope="module")
def artifacts() -> dict[str, bytes]:
    torch.manual_seed(0)
    m = ResNetMini().eval()
    out = {}
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(m), buf)
    out["torchscript"] = buf.getvalue()
    buf = io.BytesIO()
    torch.save(m, buf)
    out["pickle"] = buf.getvalue()
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    out["state_dict"] = buf.getvalue()
    buf = io.BytesIO()
    torch.export.save(torch.export.export(m, (torch.randn(1, 3, 32, 32),)), buf)
    out["export"] = buf.getvalue()
    return out


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_artifacts_are_stored_by_hash_and_recognised(tmp_path, artifacts, fmt):
    store = ModelStore(tmp_path)
    data = artifacts[fmt]
    a = store.put(io.BytesIO(data))
    assert a.digest == hashlib.sha256(data).hexdigest() and a.format == fmt and a.size == len(data)
    assert a.path.read_bytes() == data
    assert store.put(data, expected_digest=a.digest) == a  # idempotent
    assert store.get(a.digest) == a
    assert [p.name for p in tmp_path.iterdir()] == [a.path.name]  # no temp files left


def test_same_weights_share_one_entry(tmp_path, artifacts):
    store = ModelStore(tmp_path)
    assert store.put(artifacts["torchscript"]).path == store.put(artifacts["torchscript"]).path


def test_upload_over_the_limit_is_refused(tmp_path, artifacts):
    store = ModelStore(tmp_path, max_bytes=1000)
    with pytest.raises(ArtifactTooLarge, match="limit of 1000 bytes"):
        store.put(artifacts["torchscript"])
    assert list(tmp_path.iterdir()) == []


def test_corrupt_and_foreign_artifacts_are_refused(tmp_path, artifacts):
    store = ModelStore(tmp_path)
    good = bytearray(artifacts["torchscript"])
    flipped = bytes(good[:2000]) + bytes([good[2000] ^ 0xFF]) + bytes(good[2001:])
    with pytest.raises(ArtifactError, match="artifact"):
        store.put(flipped)
    with pytest.raises(ArtifactError, match="not a torch archive"):
        store.put(b"definitely not a model")
    with pytest.raises(ArtifactError, match="not a torch archive"):
        store.put(artifacts["export"][: len(artifacts["export"]) // 2])
    with pytest.raises(ArtifactError, match="empty"):
        store.put(b"")
    with pytest.raises(ArtifactError, match="digest"):
        store.put(artifacts["export"], expected_digest="0" * 64)
    with pytest.raises(ArtifactError, match="digest"):
        store.get("../etc/passwd")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["pickle", "state_dict"])
def test_a_torch_save_pickle_is_refused_naming_what_to_send_instead(tmp_path, artifacts, kind):
    store = ModelStore(tmp_path)
    with pytest.raises(ArtifactError, match="pickle is refused.*torch.export.*TorchScript"):
        store.put(artifacts[kind])
    assert list(tmp_path.iterdir()) == []


def test_a_pickle_already_on_disk_is_never_taken_for_a_model(tmp_path, artifacts):
    """An artifact written into the store's folder by other means (an older version) is refused too."""
    data = artifacts["pickle"]
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / f"{digest}.pt").write_bytes(data)
    with pytest.raises(ArtifactError, match="pickle is refused"):
        ModelStore(tmp_path).get(digest)
