"""Artifacts an attacker would upload, for the tests that prove they are refused with nothing run.

Each writes a marker file if its code ever runs; the tests assert the marker never appears.
"""

from __future__ import annotations

import functools
import io
import json
import os
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from tests.torchscript import torchscript_bytes


class RunsAShellCommand:
    """Unpickling this calls os.system (what `torch.load(weights_only=False)` did in the worker)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_pickle(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(RunsAShellCommand(marker), buf)
    return buf.getvalue()


class SavesAFile(torch.nn.Module):
    """TorchScript that writes a file when called (aten::save): as root, a way to run code."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    def forward(self, x):
        torch.save(x, self.marker)
        return x


class SavesAFileOnLoad(torch.nn.Module):
    """TorchScript whose __setstate__ (run by torch.jit.load itself) writes a file."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.marker, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.marker = state[0]
        self.training = state[1]
        torch.save(torch.zeros(1), self.marker)

    def forward(self, x):
        return x


def torchscript(module: torch.nn.Module) -> bytes:
    return torchscript_bytes(module)


def exported_linear() -> bytes:
    """A genuine torch.export program (dynamic batch), to be tampered with."""
    m = torch.nn.Linear(2, 2).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(m, (torch.randn(2, 2),), dynamic_shapes=({0: batch},))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue()


def tampered(archive: bytes, edit: Callable[[dict[str, bytes]], None]) -> bytes:
    """The archive with its entries (names relative to its root folder) changed by `edit`."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        root = z.namelist()[0].split("/", 1)[0]
        entries = {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}
    edit(entries)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in entries.items():
            z.writestr(f"{root}/{name}", data)
    return out.getvalue()


def edit_json(entries: dict[str, bytes], name: str, change: Callable[[dict], None]) -> None:
    doc = json.loads(entries[name])
    change(doc)
    entries[name] = json.dumps(doc).encode()


def entries_of(archive: bytes) -> tuple[str, list[tuple[str, bytes]]]:
    """(root folder, [(name under it, bytes)]) in the archive's order."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        root = z.namelist()[0].split("/", 1)[0]
        return root, [(i.filename.split("/", 1)[1], z.read(i)) for i in z.infolist()]


def zip_of(root: str, entries: list[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> bytes:
    """A zip of `entries` under `root`, duplicates and all (as an attacker's tool writes one)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as z, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Duplicate name")
        for name, data in entries:
            z.writestr(f"{root}/{name}", data)
    return out.getvalue()


def torch_reads(archive: bytes, part: str) -> bytes:
    """What torch's own archive reader (`PyTorchStreamReader`, miniz: the reader behind
    torch.export.load and torch.jit.load) returns for `part`."""
    return torch._C.PyTorchFileReader(io.BytesIO(archive)).get_record(part)


def shadowed(archive: bytes, part: str, hostile: bytes, decoy: bytes | None = None) -> bytes:
    """`archive` with a second entry `part` holding `hostile`, before the genuine one (or `decoy` in
    its place), where torch's reader takes the hostile entry while Python's zipfile (the last of a
    name) takes the other: issue 41's bypass. miniz finds a name by a binary search over a sorted
    index, so which duplicate it returns depends on where they sit (measured: sometimes the first,
    sometimes the last); each position before the genuine entry is tried, behind 0 to 15 empty
    `extra/` files (which both formats allow, and which move the sort), and the first layout that
    fools both readers that way is returned. AssertionError when none does."""
    root, entries = entries_of(archive)
    if decoy is not None:
        entries = [(n, decoy if n == part else d) for n, d in entries]
    genuine = dict(entries)[part]
    for fillers in range(16):
        laid = [(f"extra/pad{i}", b"") for i in range(fillers)] + entries
        at = [n for n, _ in laid].index(part)
        for pos in range(at + 1):
            data = zip_of(root, laid[:pos] + [(part, hostile)] + laid[pos:])
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                checked = z.read(f"{root}/{part}")
            if torch_reads(data, part) == hostile and checked == genuine:
                return data
    raise AssertionError(f"no layout with a second {part} makes torch read it and zipfile the other")


def without_methods(code: bytes, *names: str) -> bytes:
    """TorchScript code with the named methods cut out (the decoy a duplicate entry shows a checker)."""
    out, skipping = [], False
    for line in code.decode().splitlines(keepends=True):
        if line.startswith("  def "):
            skipping = any(line.startswith(f"  def {name}(") for name in names)
        if not skipping:
            out.append(line)
    return "".join(out).encode()


@functools.cache
def zip_bomb(archive: bytes, part: str = "models/model.json", size: int = 300 << 20) -> bytes:
    """`archive` with `part` followed by `size` bytes of spaces, deflated (issue 41: 298 KiB that
    inflate to 300 MiB; JSON allows trailing whitespace, so the program still parses)."""
    root, entries = entries_of(archive)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            if name != part:
                z.writestr(f"{root}/{name}", data)
                continue
            info = zipfile.ZipInfo(f"{root}/{name}")
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w", force_zip64=False) as f:
                f.write(data)
                block = b" " * (1 << 20)
                for _ in range(size // len(block)):
                    f.write(block)
    return out.getvalue()


def hand_zip(
    entries: list[dict],
    *,
    comment: bytes = b"",
    zip64_end: dict | None = None,
    between: bytes = b"",
) -> bytes:
    """A zip written field by field, for the tricks no zip library writes. Each entry: `name`
    (bytes), `data` (as stored in the file), and optional overrides: `method` (0), `flags` (0),
    `crc` (of `plain`, else of `data`), `size` and `csize` (declared in both headers: `len(plain)`
    and `len(data)`), `local_name`, `local_flags`, `local_extra`, `central_extra`, `local_sizes`
    (crc, csize, size in the local header), `offset` (in the central directory). `between`: bytes after each
    entry's data; `zip64_end`: fields of a zip64 end record and locator to add (`count`)."""
    import struct
    import zlib

    out = bytearray()
    central = bytearray()
    for e in entries:
        data = e["data"]
        plain = e.get("plain", data)
        crc = e.get("crc", zlib.crc32(plain))
        size, csize = e.get("size", len(plain)), e.get("csize", len(data))
        method, flags = e.get("method", 0), e.get("flags", 0)
        name, local_name = e["name"], e.get("local_name", e["name"])
        lcrc, lcsize, lsize = e.get("local_sizes", (crc, csize, size))
        lextra, cextra = e.get("local_extra", b""), e.get("central_extra", b"")
        offset = e.get("offset", len(out))
        lflags = e.get("local_flags", flags)
        out += struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 20, lflags, method, 0, 0, lcrc, lcsize, lsize, len(local_name), len(lextra)
        )
        out += local_name + lextra + data + between
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, flags, method, 0, 0, crc, csize, size, len(name),
            len(cextra), 0, 0, 0, 0, offset,
        )  # fmt: skip
        central += name + cextra
    cd_offset, count = len(out), len(entries)
    out += central
    if zip64_end is not None:
        end64 = len(out)
        n64 = zip64_end.get("count", count)
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n64, n64, len(central), cd_offset)
        out += struct.pack("<IIQI", 0x07064B50, 0, end64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), cd_offset, len(comment))
    return bytes(out + comment)


def hostile_program(program: bytes, marker) -> bytes:
    """Issue 41's .pt2: a second models/model.json, which torch's reader takes and the old check
    (zipfile: the last of a name) did not, whose shape expression sympify evaluates: a command."""
    doc = json.loads(dict(entries_of(program)[1])["models/model.json"])
    doc["graph_module"]["graph"]["tensor_values"]["input"]["sizes"][0]["as_expr"]["expr_str"] = (
        f"__import__('os').system('touch {marker}')"
    )
    return shadowed(program, "models/model.json", json.dumps(doc).encode())


def hostile_torchscript(marker) -> bytes:
    """Issue 41's TorchScript: the code torch reads defines a __setstate__ that writes `marker`
    (torch.save) at load time; the duplicate the old check read did not."""
    archive = torchscript(SavesAFileOnLoad(str(marker)))
    part, code = next((n, d) for n, d in entries_of(archive)[1] if n.startswith("code/") and n.endswith(".py"))
    return shadowed(archive, part, code, decoy=without_methods(code, "__getstate__", "__setstate__"))
