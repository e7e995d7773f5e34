"""The node's model store: artifacts by content hash, uploaded once, checked before use.

A model is identified by the SHA-256 of its artifact, so functions that ship the same weights
share one cache entry. Uploads stream to disk under a size limit, the hash is computed on the
way (and compared with the client's, when it gives one), and the archive is checked without
unpickling anything: its CRCs, its layout, and the checks of `safe_formats`, which refuse
`torch.save` pickles and whatever in a TorchScript archive or a `torch.export` program could run
code. Loading happens only in a worker process, which checks the file again.

Shared by the scheduler (which keeps every uploaded model, to upload it to a node that lacks it)
and the GPU Managers (each node's own copy): core, so that neither daemon imports the other.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from faas_gpu.contract.errors import ArtifactError, ArtifactTooLarge

from . import safe_formats

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


def detect_format(path: Path) -> str:
    """torchscript or export, from the archive's layout and `safe_formats`' checks; ArtifactError
    (naming what to send instead) for a pickle, a corrupt archive or anything else."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise ArtifactError(f"artifact: corrupt archive (CRC error in {bad})")
            return safe_formats.detect_format(z)
    except zipfile.BadZipFile as exc:
        raise ArtifactError(f"artifact: not a torch archive ({exc})") from None


class ModelStore:
    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._verified: dict[str, Artifact] = {}

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
        artifact = Artifact(digest, path.stat().st_size, detect_format(path), path)
        self._verified[digest] = artifact
        return artifact

    def put(self, data: bytes | BinaryIO, expected_digest: str | None = None) -> Artifact:
        """Store an upload (idempotent: the same bytes give the same artifact)."""
        stream = _Bytes(data) if isinstance(data, bytes | bytearray) else data
        h = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(prefix=".upload-", dir=self.root)
        tmp = Path(tmp_name)
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
            fmt = detect_format(tmp)
            final = self._path(digest)
            if final.exists():
                tmp.unlink()
            else:
                tmp.replace(final)
            artifact = Artifact(digest, size, fmt, final)
            self._verified[digest] = artifact
            return artifact
        finally:
            tmp.unlink(missing_ok=True)


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.pos = memoryview(data), 0

    def read(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return bytes(chunk)
