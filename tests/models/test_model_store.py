"""The GPU Manager's model store: content-addressed, size-limited, checked without unpickling."""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile

import pytest
import torch

from faas_gpu.models import ArtifactError, ArtifactTooLarge, ModelStore
from faas_gpu.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402

from tests.torchscript import torchscript_bytes


@pytest.fixture(scope="module")
def artifacts() -> dict[str, bytes]:
    torch.manual_seed(0)
    m = ResNetMini().eval()
    out = {}
    out["torchscript"] = torchscript_bytes(m)
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


def test_a_program_torch_wrote_is_stored_as_it_came_by_its_hash(tmp_path, artifacts):
    """torch.export.save's archive already is canonical: kept byte for byte, its digest its SHA-256."""
    store = ModelStore(tmp_path)
    data = artifacts["export"]
    a = store.put(io.BytesIO(data))
    assert a.digest == hashlib.sha256(data).hexdigest() and a.format == "export" and a.size == len(data)
    assert a.path.read_bytes() == data
    assert store.put(data, expected_digest=a.digest) == a  # idempotent
    assert store.get(a.digest) == a
    assert [p.name for p in tmp_path.iterdir()] == [a.path.name]  # no temp files left


def test_torchscript_is_stored_as_its_canonical_archive_named_by_that_archives_hash(tmp_path, artifacts):
    """torch deflates TorchScript's code: the store keeps the same entries stored, and names the
    model by what it keeps; the same upload, or the kept file sent on (scheduler to manager), gives
    the same artifact."""
    store = ModelStore(tmp_path)
    data = artifacts["torchscript"]
    a = store.put(io.BytesIO(data))
    kept = a.path.read_bytes()
    assert a.format == "torchscript" and kept != data and a.size == len(kept)
    assert a.digest == hashlib.sha256(kept).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as z, zipfile.ZipFile(io.BytesIO(kept)) as k:
        assert [(i.filename, z.read(i)) for i in z.infolist()] == [(i.filename, k.read(i)) for i in k.infolist()]
        assert {i.compress_type for i in k.infolist()} == {zipfile.ZIP_STORED}
    assert store.put(data, expected_digest=hashlib.sha256(data).hexdigest()) == a  # the header guards the transfer
    assert ModelStore(tmp_path / "node").put(kept).digest == a.digest  # a fixed point
    assert store.get(a.digest) == a
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(torch.jit.load(a.path)(x), torch.jit.load(io.BytesIO(data))(x))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [a.path.name]


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


def test_a_zip_bomb_is_refused_from_its_directory_without_inflating(tmp_path):
    """Issue 41: 298 KiB whose model.json inflates to 300 MiB (valid JSON: spaces trail it) was
    stored as an export, the daemon's memory up by ~600 MB. Refused now before anything inflates."""
    import tracemalloc

    from tests.malicious import exported_linear, zip_bomb

    bomb = zip_bomb(exported_linear())
    store = ModelStore(tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match="zip bomb"):
            store.put(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the upload's own chunks, not 300 MiB of "JSON"
    assert list(tmp_path.iterdir()) == []


def test_an_archive_that_unpacks_past_the_stores_limit_is_too_large(tmp_path, artifacts):
    from tests.malicious import entries_of

    deflated = zip_bomb_free(artifacts["export"])
    unpacked = sum(len(d) for _, d in entries_of(deflated)[1])
    assert len(deflated) < unpacked - 1
    with pytest.raises(ArtifactTooLarge, match="uncompressed"):
        ModelStore(tmp_path, max_bytes=unpacked - 1).put(deflated)
    assert list(tmp_path.iterdir()) == []


def zip_bomb_free(data: bytes) -> bytes:
    """`data` deflated: smaller on the wire than unpacked (so only the declared sizes can tell)."""
    from tests.malicious import entries_of, zip_of

    return zip_of(*entries_of(data), zipfile.ZIP_DEFLATED)


def test_a_non_canonical_file_in_the_store_is_never_taken_for_a_model(tmp_path, artifacts):
    """A file put in the store's folder by other means (or an older version) whose layout is not
    the canonical one: refused, so the workers only ever load archives this reader wrote or kept."""
    from tests.malicious import entries_of, zip_of

    data = zip_of(*entries_of(artifacts["export"]))
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / f"{digest}.pt").write_bytes(data)
    with pytest.raises(ArtifactError, match="canonical"):
        ModelStore(tmp_path).get(digest)


def test_a_reader_group_is_given_the_store_and_its_artifacts(tmp_path, artifacts):
    import os
    import stat

    gid = 4242
    store = ModelStore(tmp_path / "store", reader_gid=gid)
    a = store.put(artifacts["export"])
    for path, mode in ((tmp_path / "store", 0o750), (a.path, 0o640)):
        st = path.stat()
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, mode)
    os.chmod(a.path, 0o600)
    ModelStore(tmp_path / "store", reader_gid=gid)  # an existing store is given to it at start
    assert stat.S_IMODE(a.path.stat().st_mode) == 0o640


def test_a_starts_tightening_of_the_state_folder_leaves_the_workers_group_its_read(tmp_path, artifacts):
    """`faas-gpu up` tightens the state folder's entries (0700) whenever it starts, after the GPU
    Manager may have given its store to its workers' group: that read stays, no write appears."""
    import stat

    from faas_gpu.paths import ensure_private_home

    home = tmp_path / "home"
    store = ModelStore(home / "models", reader_gid=4242)
    a = store.put(artifacts["export"])
    (home / "secrets").mkdir(mode=0o755)
    ensure_private_home(home)
    assert stat.S_IMODE((home / "models").stat().st_mode) == 0o750
    assert stat.S_IMODE(a.path.stat().st_mode) == 0o640
    assert stat.S_IMODE((home / "secrets").stat().st_mode) == 0o700
