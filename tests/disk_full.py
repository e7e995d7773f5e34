"""A disk of a test's own to fill: a small tmpfs (root only: mount), and a file that takes its
last byte. Real ENOSPC, not a mocked write: sqlite, the logs and everything else on it see the
disk the way they would on a host whose state folder filled up."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """`folder` (made if missing) as a tmpfs of `size` (e.g. "2m") for the block; skips the test
    where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Writes a file into `folder` until its disk is full; deleting the file frees the space."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:  # unbuffered: nothing is left to flush, and fail, at the close
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass  # full at this size: smaller writes take what is left
    finally:
        os.close(fd)
    return filler
