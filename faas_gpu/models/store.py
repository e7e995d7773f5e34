"""The node's model store: artifacts by content hash, uploaded once, checked before use.

A model is identified by the SHA-256 of its **canonical archive** (`archive.write_canonical`:
the checked entries, stored, in torch's own layout), so functions that ship the same weights
share one cache entry, and what a digest names is exactly what the workers load. Uploads stream
to disk under a size limit, hashed on the way (`X-Model-Digest`, when the client sends one, is
compared with that: it guards the transfer), then read with the one strict reader
(`archive.Archive`: no duplicate or ambiguous entry, declared sizes and compression ratios within
limits before anything is inflated) and checked without unpickling anything (`safe_formats`,
which refuse `torch.save` pickles and whatever in a TorchScript archive or a `torch.export`
program could run code). Then the canonical copy is what is kept: an archive torch wrote with
nothing deflated (every `torch.export.save` program) already is one, byte for byte, so its
digest is its SHA-256 as before; any other accepted archive (TorchScript, whose code torch
deflates; one rebuilt with Python's `zipfile`) is rewritten, and the upload's answer names the
digest of what was kept. The scheduler sends managers that file, which is canonical already, so
every store of the cluster names a model by the same digest. Loading happens only in a worker
process, which reads the file with the same reader and checks it again; a file in the store that
is not canonical (written by an older version, or by other means) is never loaded.

Shared by the scheduler (which keeps every uploaded model, to upload it to a node that lacks it)
and the GPU Managers (each node's own copy): core, so that neither daemon imports the other.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from faas_gpu.contract.errors import ArtifactError, ArtifactTooLarge

from . import safe_formats
from .archive import Archive, Limits, write_canonical

__all__ = ["FORMATS", "Artifact", "ArtifactError", "ArtifactTooLarge", "ModelStore", "detect_format"]

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 2 * 1024**3
FORMATS = ("torchscript", "export")


@dataclass(frozen=True)
class Artifact:
    digest: str
    size: int
    format: str
    path: Path


def detect_format(path: Path, limits: Limits | None = None) -> str:
    """torchscript or export, of a stored (canonical) archive, every entry's CRC checked;
    ArtifactError (naming what to send instead) for a pickle, a corrupt or ambiguous archive, one
    not in canonical form, or anything else."""
    with open(path, "rb") as fh:
        archive = Archive(fh, limits)
        if not archive.canonical:
            raise ArtifactError(
                f"artifact: {path.name} is not in the store's canonical form (stored by an older version or by "
                "other means); upload the model again"
            )
        archive.verify()
        return safe_formats.detect_format(archive)


class ModelStore:
    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES, reader_gid: int | None = None):
        """reader_gid: a group that may read the artifacts (the GPU Manager's sandboxed workers,
        `gpu_manager/isolation.py`): the folder and its files are given to it, 0750 and 0640."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.limits = Limits(total_bytes=max_bytes)
        self.reader_gid = reader_gid
        self._verified: dict[str, Artifact] = {}
        if reader_gid is not None:
            self._share(self.root, 0o750)
            for path in self.root.glob("*.pt"):
                self._share(path, 0o640)

    def _share(self, path: Path, mode: int) -> None:
        if self.reader_gid is not None:
            os.chown(path, -1, self.reader_gid)
            os.chmod(path, mode)

    def _path(self, digest: str) -> Path:
        return self.root / f"{digest}.pt"

    def get(self, digest: str) -> Artifact | None:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ArtifactError(f"digest: {digest!r} is not a sha256 hex digest")
        known = self._verified.get(digest)
        if known is not None and known.path.exists():
            return known  # checked once: not on every job
        path = self._path(digest)
        if not path.exists():
            return None
        artifact = Artifact(digest, path.stat().st_size, detect_format(path, self.limits), path)
        self._verified[digest] = artifact
        return artifact

    def put(self, data: bytes | BinaryIO, expected_digest: str | None = None) -> Artifact:
        """Store an upload (idempotent: the same bytes give the same artifact), as its canonical
        archive; the artifact's digest is that archive's (the module's docstring)."""
        stream = _Bytes(data) if isinstance(data, bytes | bytearray) else data
        h = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(prefix=".upload-", dir=self.root)
        tmp = Path(tmp_name)
        canonical: Path | None = None
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ArtifactTooLarge(f"artifact: larger than the store's limit of {self.max_bytes} bytes")
                    h.update(chunk)
                    out.write(chunk)
            if size == 0:
                raise ArtifactError("artifact: empty upload")
            digest = h.hexdigest()
            if expected_digest and expected_digest.lower() != digest:
                raise ArtifactError(f"digest: upload hashes to {digest}, not {expected_digest}")
            with open(tmp, "rb") as fh:
                archive = Archive(fh, self.limits)  # refused here, from its directory, before anything is inflated
                fmt = safe_formats.detect_format(archive)
                if archive.canonical:
                    archive.verify()
                else:  # rewritten: the kept file holds exactly the entries just checked
                    canonical, digest, size = self._canonical(archive)
            if canonical is not None:
                with open(canonical, "rb") as fh:
                    if not Archive(fh, self.limits).canonical:  # the writer's own promise, held to it
                        raise ArtifactError("artifact: its canonical copy did not read back as canonical")
                tmp.unlink()
                tmp = canonical
            final = self._path(digest)
            if final.exists():
                tmp.unlink()
            else:
                self._share(tmp, 0o640)
                tmp.replace(final)
            artifact = Artifact(digest, size, fmt, final)
            self._verified[digest] = artifact
            return artifact
        finally:
            tmp.unlink(missing_ok=True)
            if canonical is not None:
                canonical.unlink(missing_ok=True)

    def _canonical(self, archive: Archive) -> tuple[Path, str, int]:
        """`archive` rewritten canonical into a new file of the store's: (path, digest, size)."""
        fd, name = tempfile.mkstemp(prefix=".canonical-", dir=self.root)
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as raw:
                out = _Hashing(raw)
                write_canonical(archive, out)
            return path, out.hash.hexdigest(), out.size
        except BaseException:
            path.unlink(missing_ok=True)
            raise


class _Hashing:
    """A file written through, hashed and counted on the way."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.raw.write(data)


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.pos = memoryview(data), 0

    def read(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return bytes(chunk)
