"""The base image's cache (~/.cache/faas-gpu) keeps what is used: another version of an entry's
kind, unused for a week and held by no builder, goes when the entry is next taken."""

from __future__ import annotations

import fcntl
import os
import time

from faas_gpu import base_image

DAY = 86400.0


def _entry(folder, name: str, age_days: float, directory: bool = False) -> None:
    path = folder / name
    if directory:
        path.mkdir()
        (path / "x.whl").write_bytes(b"w")
    else:
        path.write_bytes(b"t")
    lock = folder / f".lock-{name}"
    lock.touch()
    when = time.time() - age_days * DAY
    os.utime(lock, (when, when))
    os.utime(path, (when, when))


def test_taking_an_entry_removes_old_unused_versions_of_its_kind_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FAAS_GPU_CACHE", str(tmp_path))
    _entry(tmp_path, "wheelhouse-aaaaaaaaaaaaaaaa", 8, directory=True)  # old: goes
    _entry(tmp_path, "wheelhouse-bbbbbbbbbbbbbbbb", 1, directory=True)  # used yesterday: stays
    _entry(tmp_path, "python-deps-cccccccccccccccc.tar", 30)  # another kind: stays
    _entry(tmp_path, "wheelhouse-eeeeeeeeeeeeeeee", 9, directory=True)  # old but a builder holds it
    (tmp_path / "wheelhouse-ffffffffffffffff.part").mkdir()  # a killed build's leftover
    old = time.time() - 10 * DAY
    os.utime(tmp_path / "wheelhouse-ffffffffffffffff.part", (old, old))
    with open(tmp_path / ".lock-wheelhouse-eeeeeeeeeeeeeeee", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with base_image.locked("wheelhouse-dddddddddddddddd"):
            pass
    names = {p.name for p in tmp_path.iterdir()}
    assert "wheelhouse-aaaaaaaaaaaaaaaa" not in names and ".lock-wheelhouse-aaaaaaaaaaaaaaaa" not in names
    assert "wheelhouse-ffffffffffffffff.part" not in names and ".lock-wheelhouse-ffffffffffffffff" not in names
    assert {"wheelhouse-bbbbbbbbbbbbbbbb", "python-deps-cccccccccccccccc.tar", "wheelhouse-eeeeeeeeeeeeeeee"} <= names
    assert time.time() - (tmp_path / ".lock-wheelhouse-dddddddddddddddd").stat().st_mtime < 60  # marked used


def test_a_used_entry_is_not_pruned_however_old_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("FAAS_GPU_CACHE", str(tmp_path))
    _entry(tmp_path, "registry-aaaaaaaaaaaaaaaa", 20, directory=True)
    base_image.used("registry-aaaaaaaaaaaaaaaa")  # a reader that does not take the lock
    assert base_image.prune("registry-bbbbbbbbbbbbbbbb") == []
    assert base_image.prune("not-an-entry") == []
