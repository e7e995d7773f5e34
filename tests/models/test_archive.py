"""The one reader of model archives (`faas_gpu.models.archive`): one meaning or none, limits
before reading, and the canonical archive the store keeps (issue 41, findings 2 and 3).

Each hostile archive here is one that Python's zipfile or torch's reader (miniz) would read in a
way of its own: a second entry of a name, a name that normalises to another, a local header
that says something else than the directory, bytes no entry owns, a second end record, zip64
fields that disagree, or sizes that lie.
"""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile
import zlib

import pytest

from faas_gpu.contract.errors import ArtifactError, ArtifactTooLarge
from faas_gpu.models.archive import Archive, Limits, write_canonical
from tests.malicious import entries_of, exported_linear, hand_zip, shadowed, torch_reads, zip_bomb, zip_of
from tests.torchscript import torchscript_bytes

MODEL = "models/model.json"


@pytest.fixture(scope="module")
def program() -> bytes:
    return exported_linear()


def read(data: bytes, limits: Limits | None = None) -> Archive:
    return Archive(io.BytesIO(data), limits)


def canonical(data: bytes) -> bytes:
    out = io.BytesIO()
    write_canonical(read(data), out)
    return out.getvalue()


def refused(data: bytes, match: str, limits: Limits | None = None) -> None:
    with pytest.raises(ArtifactError, match=match):
        archive = read(data, limits)
        archive.verify()


# -- the canonical archive ------------------------------------------------------------------------
def test_a_program_torch_wrote_is_its_own_canonical_archive(program):
    archive = read(program)
    assert archive.canonical
    assert canonical(program) == program


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_the_same_entries_rebuilt_by_zipfile_come_back_as_torchs_own_bytes(program, compression):
    root, entries = entries_of(program)
    rebuilt = zip_of(root, entries, compression)
    assert rebuilt != program and not read(rebuilt).canonical
    assert canonical(rebuilt) == program


def test_torchscript_is_rewritten_stored_and_torch_loads_the_rewrite():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).eval()
    data = torchscript_bytes(model)
    assert not read(data).canonical  # torch deflates TorchScript's code
    kept = canonical(data)
    assert read(kept).canonical and canonical(kept) == kept
    with zipfile.ZipFile(io.BytesIO(kept)) as k:
        assert {i.compress_type for i in k.infolist()} == {zipfile.ZIP_STORED}
    x = torch.randn(4, 3)
    assert torch.equal(torch.jit.load(io.BytesIO(kept))(x), model(x))


def test_each_record_of_the_canonical_archive_starts_on_a_64_byte_boundary(program):
    """torch's layout: weights are mapped in place from the store (`gpu_manager/weights.py`)."""
    root, entries = entries_of(program)
    archive = read(canonical(zip_of(root, entries)))
    assert all(e.data_offset % 64 == 0 for e in archive.entries)


# -- one meaning or none ---------------------------------------------------------------------------
def test_two_entries_of_one_name_are_refused_wherever_they_sit(program):
    root, entries = entries_of(program)
    for pos in (0, len(entries) // 2, len(entries)):
        data = zip_of(root, entries[:pos] + [(MODEL, b"{}")] + entries[pos:])
        refused(data, "appears twice")


def test_a_duplicate_torch_reads_and_zipfile_does_not_is_refused(program):
    """The bypass itself: the layout is chosen so that torch's reader returns the hostile entry
    (checked here with torch's own reader) while zipfile, which the check used, returns the other."""
    hostile = b'{"hostile": true}'
    data = shadowed(program, MODEL, hostile)
    assert torch_reads(data, MODEL) == hostile
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.read(f"archive/{MODEL}") != hostile
    refused(data, "appears twice")


@pytest.mark.parametrize(
    "name, why",
    [
        (b"archive/./models/model.json", "plain relative path"),
        (b"archive//models/model.json", "plain relative path"),
        (b"archive\\models\\model.json", "plain relative path"),
        (b"archive/data/../models/model.json", "plain relative path"),
        (b"/archive/models/model.json", "plain relative path"),
        (b"archive/models/model.json/", "plain relative path"),
        (b"archive/models/m\xc3\xb6del.json", "not ASCII"),
        (b"archive/models/model.json\x00.txt", "plain relative path"),
        (b"archive/Models/Model.JSON", "differ only by case"),
    ],
)
def test_a_name_that_could_mean_another_entry_is_refused(program, name, why):
    root, entries = entries_of(program)
    raw = [{"name": f"{root}/{n}".encode(), "data": d} for n, d in entries]
    refused(hand_zip([*raw, {"name": name, "data": b"{}"}]), why)


def test_a_local_header_naming_another_entry_than_the_directory_is_refused(program):
    root, entries = entries_of(program)
    raw = [{"name": f"{root}/{n}".encode(), "data": d} for n, d in entries]
    raw[0]["local_name"] = raw[0]["name"][:-1] + b"9"
    refused(hand_zip(raw), "names another entry")


def test_a_local_header_with_other_flags_than_the_directory_is_refused():
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = c.compress(b"x" * 100) + c.flush()
    entry = {"name": b"archive/x", "data": stream, "plain": b"x" * 100, "method": 8}
    assert read(hand_zip([entry])).read("archive/x", 1000) == b"x" * 100
    entry["local_flags"] = 1  # encrypted, says the local header alone
    refused(hand_zip([entry]), "another method or flags")


def test_a_local_header_declaring_other_sizes_is_refused(program):
    root, entries = entries_of(program)
    raw = [{"name": f"{root}/{n}".encode(), "data": d} for n, d in entries]
    raw[0]["local_sizes"] = (zlib.crc32(raw[0]["data"]), 4, 4)
    refused(hand_zip(raw), "declares other sizes or CRC")


def test_bytes_that_belong_to_no_entry_are_refused(program):
    root, entries = entries_of(program)
    raw = [{"name": f"{root}/{n}".encode(), "data": d} for n, d in entries]
    refused(hand_zip(raw, between=b"hidden"), "belongs to no entry")


def test_data_before_the_first_entry_is_refused_though_zipfile_reads_past_it(program):
    data = b"#!/bin/sh\nexit 0\n" + program
    with zipfile.ZipFile(io.BytesIO(data)) as z:  # zipfile takes the prefix for a self-extractor
        assert z.testzip() is None
    refused(data, "data between|not where")


def test_a_second_archive_after_the_first_is_refused(program):
    refused(program + program, "data between|not where")


def test_an_end_record_with_a_comment_is_refused(program):
    data = bytearray(program)
    struct.pack_into("<H", data, len(data) - 2, 22)
    refused(bytes(data) + bytes(data[-22:]), "comment")


def test_zip64_records_that_disagree_with_the_end_record_are_refused():
    entry = {"name": b"archive/x", "data": b"abc"}
    assert read(hand_zip([entry], zip64_end={})).names() == ["archive/x"]
    refused(hand_zip([entry], zip64_end={"count": 2}), "disagree")


def test_zip64_fields_where_no_size_needs_them_are_refused():
    zip64 = struct.pack("<HHQQ", 1, 16, 999, 999)
    refused(hand_zip([{"name": b"archive/x", "data": b"abc", "central_extra": struct.pack("<HHQ", 1, 8, 3)}]), "zip64")
    refused(hand_zip([{"name": b"archive/x", "data": b"abc", "local_extra": zip64}]), "zip64")
    refused(hand_zip([{"name": b"archive/x", "data": b"abc", "size": 0xFFFFFFFF, "csize": 0xFFFFFFFF}]), "sentinel")


@pytest.mark.parametrize(
    "override, why",
    [
        ({"flags": 1}, "encrypted"),
        ({"method": 12}, "compression method 12"),
        ({"central_extra": struct.pack("<HH", 0x7075, 5) + b"\x01abcd"}, "extra field of kind 0x7075"),
        ({"crc": 1}, "CRC"),
    ],
)
def test_what_some_reader_would_read_otherwise_is_refused(override, why):
    refused(hand_zip([{"name": b"archive/x", "data": b"abc", **override}]), why)


def test_a_deflate_stream_with_bytes_after_its_end_is_refused():
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = c.compress(b"hello" * 100) + c.flush() + b"tail"
    refused(hand_zip([{"name": b"archive/x", "data": stream, "plain": b"hello" * 100, "method": 8}]), "after its")


# -- limits before reading --------------------------------------------------------------------------
def test_the_zip_bomb_is_refused_from_its_directory_without_inflating(program):
    bomb = zip_bomb(program)
    assert len(bomb) < 400 << 10  # issue 41's: 298 KiB declaring 300 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match="zip bomb"):
            read(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_an_entry_that_inflates_past_what_it_declares_stops_there(program):
    """A lying header: 100 MiB of spaces declared as 64 KiB (within the ratio): reading produces at
    most the declared size plus one byte before it is refused."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    block = b" " * (1 << 20)
    stream = b"".join(c.compress(block) for _ in range(100)) + c.flush()
    lie = hand_zip([{"name": b"archive/x", "data": stream, "method": 8, "size": 64 << 10, "crc": 0}])
    archive = read(lie)
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match="more than the 65536 bytes it declares"):
            archive.read("archive/x", 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_a_read_is_refused_before_it_starts_when_the_entry_declares_more_than_the_reader_takes(program):
    with pytest.raises(ArtifactError, match="at most 100 are read here"):
        read(program).read(f"archive/{MODEL}", 100)


@pytest.mark.parametrize(
    "limits, error, why",
    [
        (Limits(entries=5), ArtifactError, "entries, more than the 5 allowed"),
        (Limits(name_bytes=30), ArtifactError, "an entry name of"),
        (Limits(total_bytes=5000), ArtifactTooLarge, "more than 5000 bytes uncompressed"),
        (Limits(total_bytes=1000), ArtifactTooLarge, "over the limit of 1000"),
        (Limits(central_bytes=100), ArtifactError, "central directory of"),
    ],
)
def test_what_the_directory_declares_is_held_to_the_limits(program, limits, error, why):
    with pytest.raises(error, match=why):
        read(program, limits)
