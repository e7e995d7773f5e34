"""The one reader of model archives, and the canonical archive the store keeps and torch loads.

Why a reader of our own: a zip can mean different things to different readers. Python's
`zipfile` takes the *last* entry of a name; torch's (`PyTorchStreamReader`, miniz) looks names up
by a binary search over a sorted index, so which of two entries of one name it reads depends on
where they sit (measured with torch 2.13: sometimes the first, sometimes the last). An archive
checked with one reader and loaded with the other was an archive whose hostile entry was never
checked (issue 41). And a zip's entries declare their own sizes: 298 KiB of deflated spaces
inflate to 300 MiB of "JSON" in the daemon that reads them.

So an archive is read here, strictly, once, and the checks (`safe_formats`) and the store read it
through this reader only:

- **one meaning or none.** The central directory is the only index; the file is exactly: local
  entries from offset 0, one after another (each its header, its data, its data descriptor if it
  says it has one), the central directory right after the last, then at most one zip64 end record
  and its locator, then the end record, with no comment, at the very end. Every local header must
  repeat its central entry (name byte for byte, flags, method, sizes and CRC or a descriptor that
  does). Names are ASCII from a small set (letters, digits, `_ . - /`), relative, without `.`,
  `..` or empty components, backslashes or a trailing `/`, and unique even ignoring case.
  Encrypted entries, methods other than stored and deflate, extra fields other than zip64's and
  torch's alignment padding, zip64 fields where no size needs them (or sentinels without them),
  split archives and comments are refused. Nothing is searched for: a second end record hidden in
  the data is just data, because the end record is where the file ends.
- **limits before reading.** From the central directory alone, before any entry is read or
  inflated: at most `Limits.entries` entries, names of at most `Limits.name_bytes`, each entry's
  and all entries' declared uncompressed sizes at most `Limits.total_bytes`, and a deflated
  entry's declared size at most `Limits.ratio` times its compressed size (past
  `Limits.ratio_free_bytes`). Reading enforces the same declared size (inflation stops one byte
  past it: a lying header is refused having produced at most that) and the CRC.
- **the canonical archive.** `write_canonical` writes the checked entries again, in the same
  order, with the same names and bytes, every entry stored (uncompressed), in torch's own layout
  (`PyTorchStreamWriter`'s: 64-byte aligned data through an `FB` padding field, data
  descriptors, a zip64 end record). The store keeps that file only and the workers load only
  it, so torch only ever sees the bytes that were checked, at offsets nobody else chose. An
  archive torch itself wrote with no deflated entry (every `torch.export.save` program) already
  is canonical, byte for byte: it is kept as it came, and its digest is its SHA-256.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from faas_gpu.contract.errors import ArtifactError, ArtifactTooLarge

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # 46 bytes
_END = struct.Struct("<IHHHHIIH")  # 22 bytes
_END64 = struct.Struct("<IQHHIIQQQQ")  # 56 bytes
_LOCATOR = struct.Struct("<IIQI")  # 20 bytes
_LOCAL_SIG, _CENTRAL_SIG, _END_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_END64_SIG, _LOCATOR_SIG, _DESCRIPTOR_SIG = 0x06064B50, 0x07064B50, 0x08074B50
_ZIP64_EXTRA, _PADDING_EXTRA = 0x0001, 0x4246  # zip64 sizes; torch's alignment padding ("FB")
_U16, _U32 = 0xFFFF, 0xFFFFFFFF
_STORED, _DEFLATED = 0, 8
_FLAGS_ALLOWED = 0x0002 | 0x0004 | 0x0008 | 0x0800  # deflate options, data descriptor, UTF-8 names
_NAME = re.compile(r"[A-Za-z0-9_.\-/]+")
ALIGNMENT = 64  # torch aligns each record's data: weights are mapped in place (`gpu_manager/weights.py`)
CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What an archive may declare, checked from its central directory before anything is read."""

    total_bytes: int = 2 * 1024**3  # every entry's uncompressed size, and all of them together
    entries: int = 65_535
    name_bytes: int = 1024
    ratio: int = 100  # a deflated entry's uncompressed size over its compressed size
    ratio_free_bytes: int = 1 << 20  # entries this small are not held to the ratio
    central_bytes: int = 64 << 20  # the central directory itself


@dataclass(frozen=True)
class Entry:
    name: str
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int
    data_offset: int  # where its (compressed) data starts in the file
    flags: int = 0


class Archive:
    """A zip archive read strictly (see the module's docstring); ArtifactError for anything else.

    `fh` is a seekable binary file; the archive reads it lazily and never closes it."""

    def __init__(self, fh: BinaryIO, limits: Limits | None = None):
        self.fh, self.limits = fh, limits or Limits()
        fh.seek(0, 2)
        self.file_size = fh.tell()
        self.entries: list[Entry] = []
        self.canonical = True  # every byte outside the entries' data is what `write_canonical` writes
        self._by_name: dict[str, Entry] = {}
        self._parse()

    # -- reading the layout ---------------------------------------------------------------------
    def _read_at(self, offset: int, n: int) -> bytes:
        if offset < 0 or offset + n > self.file_size:
            raise ArtifactError("artifact: not a torch archive (a record runs past the end of the file)")
        self.fh.seek(offset)
        data = self.fh.read(n)
        if len(data) != n:
            raise ArtifactError("artifact: not a torch archive (the file ended early)")
        return data

    def _parse(self) -> None:
        if self.file_size < _END.size:
            raise ArtifactError("artifact: not a torch archive (too short for a zip)")
        end_at = self.file_size - _END.size
        sig, disk, cd_disk, n_disk, n, cd_size, cd_offset, comment = _END.unpack(self._read_at(end_at, _END.size))
        if sig != _END_SIG:
            raise ArtifactError("artifact: not a torch archive (no zip end record at the end of the file)")
        if comment or disk or cd_disk or n_disk != n:
            raise ArtifactError("artifact: a zip with a comment, or split across disks, is refused")
        cd_end = end_at
        if end_at >= _LOCATOR.size + _END64.size and self._read_at(end_at - _LOCATOR.size, 4) == b"PK\x06\x07":
            lsig, ldisk, end64_at, disks = _LOCATOR.unpack(self._read_at(end_at - _LOCATOR.size, _LOCATOR.size))
            if ldisk or disks != 1 or end64_at != end_at - _LOCATOR.size - _END64.size:
                raise ArtifactError("artifact: the zip64 end record is not where it belongs")
            fields = _END64.unpack(self._read_at(end64_at, _END64.size))
            sig64, rec_size, _made, _needed, disk64, cd_disk64, n_disk64, n64, cd_size64, cd_offset64 = fields
            if sig64 != _END64_SIG or rec_size != _END64.size - 12 or disk64 or cd_disk64 or n_disk64 != n64:
                raise ArtifactError("artifact: a malformed zip64 end record")
            for small, big, sentinel in ((n, n64, _U16), (cd_size, cd_size64, _U32), (cd_offset, cd_offset64, _U32)):
                if small != (big if big < sentinel else sentinel):
                    raise ArtifactError("artifact: the zip64 end record and the end record disagree")
            n, cd_size, cd_offset, cd_end = n64, cd_size64, cd_offset64, end64_at
        elif _U16 == n or _U32 in (cd_size, cd_offset):
            raise ArtifactError("artifact: a zip64 sentinel without a zip64 end record")
        else:
            self.canonical = False  # torch writes the zip64 end record always
        if n > self.limits.entries:
            raise ArtifactError(f"artifact: {n} entries, more than the {self.limits.entries} allowed")
        if cd_size > self.limits.central_bytes:
            raise ArtifactError(f"artifact: a central directory of {cd_size} bytes is refused")
        if cd_offset + cd_size != cd_end:
            raise ArtifactError("artifact: data between the central directory and the end record")
        self._central(self._read_at(cd_offset, cd_size), n)
        self._locals(cd_offset)
        if self.canonical:
            self.canonical = self._tail(cd_offset) == self._read_at(cd_offset, self.file_size - cd_offset)

    def _central(self, cd: bytes, n: int) -> None:
        pos, total, seen = 0, 0, {}
        for _ in range(n):
            if pos + _CENTRAL.size > len(cd):
                raise ArtifactError("artifact: the central directory is shorter than its entry count")
            f = _CENTRAL.unpack_from(cd, pos)
            sig, _made, _needed, flags, method, _time, _date, crc, csize, size, nlen, xlen, clen, disk, _, _, offset = f
            if sig != _CENTRAL_SIG:
                raise ArtifactError("artifact: a malformed central directory entry")
            if nlen > self.limits.name_bytes:
                raise ArtifactError(f"artifact: an entry name of {nlen} bytes (at most {self.limits.name_bytes})")
            raw = cd[pos + _CENTRAL.size : pos + _CENTRAL.size + nlen]
            extra = cd[pos + _CENTRAL.size + nlen : pos + _CENTRAL.size + nlen + xlen]
            pos += _CENTRAL.size + nlen + xlen + clen
            if pos > len(cd):
                raise ArtifactError("artifact: a central directory entry runs past the directory")
            name = _name(raw)
            if clen or disk:
                raise ArtifactError(f"artifact: entry {name} has a comment or another disk")
            if flags & ~_FLAGS_ALLOWED:
                raise ArtifactError(f"artifact: entry {name} is encrypted or uses zip features refused here")
            if method not in (_STORED, _DEFLATED):
                raise ArtifactError(f"artifact: entry {name} uses compression method {method} (stored or deflate only)")
            size, csize, offset = _zip64(extra, name, size, csize, offset, local=False)
            if method == _STORED and size != csize:
                raise ArtifactError(f"artifact: stored entry {name} declares two sizes")
            if size > self.limits.total_bytes:
                raise ArtifactTooLarge(
                    f"artifact: entry {name} declares {size} bytes, over the limit of {self.limits.total_bytes}"
                )
            if method == _DEFLATED and size > max(self.limits.ratio_free_bytes, self.limits.ratio * csize):
                raise ArtifactError(
                    f"artifact: entry {name} inflates {csize} bytes to {size}, more than {self.limits.ratio} times "
                    "(a zip bomb)"
                )
            total += size
            if total > self.limits.total_bytes:
                raise ArtifactTooLarge(
                    f"artifact: its entries declare more than {self.limits.total_bytes} bytes uncompressed"
                )
            folded = name.casefold()
            if folded in seen:
                other = seen[folded]
                what = "twice" if other == name else f"and {other}, names that differ only by case"
                raise ArtifactError(f"artifact: entry {name} appears {what} (an ambiguous archive is refused)")
            seen[folded] = name
            self.entries.append(Entry(name, method, crc, csize, size, offset, 0, flags))
        if pos != len(cd):
            raise ArtifactError("artifact: the central directory holds more than its entries")

    def _locals(self, cd_offset: int) -> None:
        """Each local header where the previous entry ended, repeating its central entry."""
        at = 0
        for i, e in enumerate(self.entries):
            if e.header_offset != at:
                raise ArtifactError(f"artifact: entry {e.name} is not where the previous one ended (hidden data)")
            head = self._read_at(at, _LOCAL.size)
            sig, _needed, flags, method, _time, _date, crc, csize, size, nlen, xlen = _LOCAL.unpack(head)
            raw = self._read_at(at + _LOCAL.size, nlen + xlen)
            if sig != _LOCAL_SIG or raw[:nlen] != e.name.encode("ascii"):
                raise ArtifactError(f"artifact: the local header of {e.name} names another entry")
            if method != e.method or flags != e.flags:
                raise ArtifactError(f"artifact: the local header of {e.name} says another method or flags")
            described = bool(flags & 0x0008)
            lsize, lcsize, _ = _zip64(raw[nlen:], e.name, size, csize, None, local=True)
            if described:  # the sizes and CRC follow the data; here they may be left 0
                ok = crc in (0, e.crc) and lcsize in (0, e.compressed_size) and lsize in (0, e.size)
            else:
                ok = (crc, lcsize, lsize) == (e.crc, e.compressed_size, e.size)
            if not ok:
                raise ArtifactError(f"artifact: the local header of {e.name} declares other sizes or CRC")
            data_offset = at + _LOCAL.size + nlen + xlen
            data_end = end = data_offset + e.compressed_size
            following = self.entries[i + 1].header_offset if i + 1 < len(self.entries) else cd_offset
            if described:
                end = self._descriptor(e, end, following - end)
            if end != following:
                raise ArtifactError(f"artifact: data after entry {e.name} belongs to no entry")
            if self.canonical and (
                e.method != _STORED
                or head + raw != _local_header(raw[:nlen], at, e.size)
                or self._read_at(data_end, end - data_end) != _descriptor(e.crc, e.size, at)
            ):
                self.canonical = False
            self.entries[i] = e = Entry(e.name, e.method, e.crc, e.compressed_size, e.size, at, data_offset, flags)
            self._by_name[e.name] = e
            at = following
        if at != cd_offset:
            raise ArtifactError("artifact: data between the last entry and the central directory")

    def _descriptor(self, e: Entry, at: int, length: int) -> int:
        """The data descriptor after `e`'s data (with or without its signature, 32 or 64-bit)."""
        forms = {16: "<IIII", 24: "<IIQQ", 12: "<III", 20: "<IQQ"}
        if length not in forms:
            raise ArtifactError(f"artifact: entry {e.name} has no data descriptor where it says it has one")
        values = struct.unpack(forms[length], self._read_at(at, length))
        if length in (16, 24):
            if values[0] != _DESCRIPTOR_SIG:
                raise ArtifactError(f"artifact: a malformed data descriptor after {e.name}")
            values = values[1:]
        if tuple(values) != (e.crc, e.compressed_size, e.size):
            raise ArtifactError(f"artifact: the data descriptor of {e.name} declares other sizes or CRC")
        return at + length

    def _tail(self, cd_offset: int) -> bytes:
        """The central directory and end records `write_canonical` would write for these entries."""
        return _tail(self.entries, cd_offset)

    # -- reading entries --------------------------------------------------------------------------
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def entry(self, name: str) -> Entry:
        try:
            return self._by_name[name]
        except KeyError:
            raise ArtifactError(f"artifact: no entry {name}") from None

    def read(self, name: str, limit: int) -> bytes:
        """An entry's bytes, refused (before reading) when it declares more than `limit`."""
        e = self.entry(name)
        if e.size > limit:
            raise ArtifactError(f"artifact: entry {name} declares {e.size} bytes; at most {limit} are read here")
        return b"".join(self.chunks(e))

    def chunks(self, e: Entry) -> Iterator[bytes]:
        """An entry's bytes in chunks, never more than it declares, its CRC checked at the end."""
        crc, produced, left = 0, 0, e.compressed_size
        self.fh.seek(e.data_offset)
        inflate = zlib.decompressobj(-15) if e.method == _DEFLATED else None
        while left or (inflate is not None and not inflate.eof):
            raw = self.fh.read(min(CHUNK, left)) if left else b""
            if left and not raw:
                raise ArtifactError(f"artifact: entry {e.name} ends early")
            left -= len(raw)
            pending = raw
            while True:  # bounded: never more than one byte past the declared size
                if inflate is None:
                    out, pending = pending, b""
                else:
                    try:
                        out = inflate.decompress(pending, e.size - produced + 1)
                    except zlib.error as exc:
                        raise ArtifactError(f"artifact: entry {e.name} does not inflate ({exc})") from None
                    pending = inflate.unconsumed_tail
                produced += len(out)
                if produced > e.size:
                    raise ArtifactError(f"artifact: entry {e.name} holds more than the {e.size} bytes it declares")
                if out:
                    crc = zlib.crc32(out, crc)
                    yield out
                if not pending:
                    break
            if inflate is not None and not left and not inflate.eof:
                raise ArtifactError(f"artifact: entry {e.name}'s deflate stream does not end")
            if inflate is None and not left:
                break
        if inflate is not None and inflate.unused_data:
            raise ArtifactError(f"artifact: entry {e.name} has data after its deflate stream")
        if produced != e.size or crc != e.crc:
            raise ArtifactError(f"artifact: corrupt archive (CRC or size error in {e.name})")

    def verify(self) -> None:
        """Every entry read through, sizes and CRCs checked (what `zipfile.testzip` did)."""
        for e in self.entries:
            for _ in self.chunks(e):
                pass


# -- names and extra fields ------------------------------------------------------------------------
def _name(raw: bytes) -> str:
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ArtifactError(f"artifact: entry name {raw[:80]!r} is not ASCII") from None
    parts = name.split("/")
    if not _NAME.fullmatch(name) or any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(
            f"artifact: entry name {name[:200]!r} is not a plain relative path of letters, digits, '_', '.', "
            "'-' and '/'"
        )
    return name


def _extras(extra: bytes, name: str, allowed: set[int]) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    pos = 0
    while pos < len(extra):
        if pos + 4 > len(extra):
            raise ArtifactError(f"artifact: entry {name} has a malformed extra field")
        kind, length = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        if len(body) != length:
            raise ArtifactError(f"artifact: entry {name} has a malformed extra field")
        if kind not in allowed:
            raise ArtifactError(f"artifact: entry {name} has an extra field of kind 0x{kind:04x}, refused here")
        if kind in found:
            raise ArtifactError(f"artifact: entry {name} has two extra fields of kind 0x{kind:04x}")
        found[kind] = body
        pos += 4 + length
    return found


def _zip64(
    extra: bytes, name: str, size: int, csize: int, offset: int | None, local: bool
) -> tuple[int, int, int | None]:
    """Sizes (and offset) with zip64's fields read where, and only where, a field says 0xFFFFFFFF."""
    fields = _extras(extra, name, {_ZIP64_EXTRA, _PADDING_EXTRA})
    body = fields.get(_ZIP64_EXTRA)
    wanted = [size == _U32, csize == _U32, offset == _U32]
    if local and any(wanted[:2]):
        wanted[:2] = [True, True]  # a local header's zip64 field holds both sizes
    if body is None:
        if any(wanted):
            raise ArtifactError(f"artifact: entry {name} has a zip64 sentinel without its zip64 field")
        return size, csize, offset
    if local and not any(wanted) and len(body) == 16 and struct.unpack("<QQ", body) == (size, csize):
        return size, csize, offset  # Python's zipfile writes one always (force_zip64): it repeats the header
    if not any(wanted) or len(body) != 8 * sum(wanted):
        raise ArtifactError(f"artifact: entry {name} has a zip64 field that does not match its header")
    values = iter(struct.unpack(f"<{sum(wanted)}Q", body))
    size = next(values) if wanted[0] else size
    csize = next(values) if wanted[1] else csize
    offset = next(values) if wanted[2] else offset
    return size, csize, offset


# -- the canonical archive ---------------------------------------------------------------------------
def _needs_zip64(size: int, offset: int) -> bool:
    return size >= _U32 or offset >= _U32


def _padding(offset: int, name_len: int, size: int) -> bytes:
    """torch's `getPadding`: an `FB` extra field that puts the record's data on a 64-byte boundary
    (after the zip64 field a header at or past 4 GiB, or of a record of 4 GiB or more, carries)."""
    start = offset + _LOCAL.size + name_len + 4
    if _needs_zip64(size, offset):
        start += 4 + 16
    pad = -start % ALIGNMENT
    zip64 = struct.pack("<HHQQ", _ZIP64_EXTRA, 16, size, size) if _needs_zip64(size, offset) else b""
    return zip64 + struct.pack("<HH", _PADDING_EXTRA, pad) + b"Z" * pad


def _local_header(name: bytes, offset: int, size: int) -> bytes:
    extra = _padding(offset, len(name), size)
    zip64 = _needs_zip64(size, offset)
    sizes = _U32 if zip64 else 0
    return _LOCAL.pack(_LOCAL_SIG, 0, 0x0808, _STORED, 0, 0, 0, sizes, sizes, len(name), len(extra)) + name + extra


def _descriptor(crc: int, size: int, offset: int) -> bytes:
    if _needs_zip64(size, offset):
        return struct.pack("<IIQQ", _DESCRIPTOR_SIG, crc, size, size)
    return struct.pack("<IIII", _DESCRIPTOR_SIG, crc, size, size)


def _tail(entries: list[Entry], cd_offset: int) -> bytes:
    """The central directory (each entry stored, at its header offset), then the zip64 end record,
    its locator and the end record, as torch's writer leaves them."""
    out = bytearray()
    for e in entries:
        name = e.name.encode("ascii")
        wanted = [e.size >= _U32, e.size >= _U32, e.header_offset >= _U32]
        extra = b""
        if any(wanted):
            values = [v for v, w in zip((e.size, e.size, e.header_offset), wanted, strict=True) if w]
            extra = struct.pack(f"<HH{len(values)}Q", _ZIP64_EXTRA, 8 * len(values), *values)
        size32 = _U32 if wanted[0] else e.size
        offset32 = _U32 if wanted[2] else e.header_offset
        out += _CENTRAL.pack(
            _CENTRAL_SIG, 0, 0, 0x0808, _STORED, 0, 0, e.crc, size32, size32, len(name), len(extra), 0, 0, 0, 0,
            offset32,
        )  # fmt: skip
        out += name + extra
    n, cd_size, end64_at = len(entries), len(out), cd_offset + len(out)
    out += _END64.pack(_END64_SIG, _END64.size - 12, 0x031E, 45, 0, 0, n, n, cd_size, cd_offset)
    out += _LOCATOR.pack(_LOCATOR_SIG, 0, end64_at, 1)
    out += _END.pack(_END_SIG, 0, 0, min(n, _U16), min(n, _U16), min(cd_size, _U32), min(cd_offset, _U32), 0)
    return bytes(out)


def write_canonical(archive: Archive, out: BinaryIO) -> None:
    """`archive`'s entries, in order, each stored, in torch's layout (the module's docstring).
    Every entry is read through `Archive.chunks`: its declared size and CRC enforced as it goes."""
    written: list[Entry] = []
    at = 0
    for e in archive.entries:
        name = e.name.encode("ascii")
        head = _local_header(name, at, e.size)
        out.write(head)
        for chunk in archive.chunks(e):
            out.write(chunk)
        tail = _descriptor(e.crc, e.size, at)
        out.write(tail)
        written.append(Entry(e.name, _STORED, e.crc, e.size, e.size, at, at + len(head)))
        at += len(head) + e.size + len(tail)
    out.write(_tail(written, at))
