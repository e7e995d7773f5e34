"""Artifacts an attacker would upload, for the tests that prove they are refused with nothing run.

Each writes a marker file if its code ever runs; the tests assert the marker never appears.
"""

from __future__ import annotations

import io
import json
import os
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
