"""TorchScript artifacts, as users who saved models years ago have them.

The GPU path still runs TorchScript (old artifacts), so the managers', store's and client's tests
build some. torch 2.13 deprecates *building* TorchScript; that warning is about these fixtures, not
about faas-gpu's code (which never builds TorchScript and loads it quietly, saying once that
`faas_gpu.save_model` is the way now), so it is silenced here and only here.
"""

from __future__ import annotations

import io
import os
import warnings

import torch


def torchscript_bytes(module: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    save_torchscript(module, buf)
    return buf.getvalue()


def save_torchscript(module: torch.nn.Module, dest: str | os.PathLike | io.BytesIO) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
        torch.jit.save(torch.jit.script(module), dest)
