"""Saving a model the way python3-gpu loads it, and explaining the ways that cannot work.

Both sides use it: a helper script or `faas-gpu export` saves with `save_model`; the in-container
client (`faas_gpu.client`) converts a pickled module with `export_program` and explains a
helper script's whole-module pickle with `explain_pickle`. Kept apart from the client so that the
user-side helpers do not grow the client's request path, and the checks are the managers' own
(`faas_gpu.models.safe_formats`).
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path

import torch

from faas_gpu.contract.errors import ArtifactError, ArtifactTooLarge
from faas_gpu.models.archive import Archive
from faas_gpu.models.batch_limits import BatchLimits
from faas_gpu.models.safe_formats import detect, pickled_class

HOW_TO_SAVE = (
    "save the model with faas_gpu.save_model(model, example_input, 'model.pt2') (a torch.export program: "
    "torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim('batch')},)) then "
    "torch.export.save) and load it in the handler with torch.export.load('model.pt2').module(), "
    "or ship a state dict or safetensors, build the module in the handler and call faas_gpu.remote(module); "
    "TorchScript (torch.jit.load) still runs for models you already have that way"
)


class NotConvertible(RuntimeError):
    """A whole model loaded in the handler that cannot become an artifact the GPU path accepts."""


def export_program(module: torch.nn.Module, example: torch.Tensor, where: str = "") -> bytes:
    """`module` as the bytes of a torch.export program whose first dimension is a named batch
    dimension: traced at batch 2 (batch 1 would be specialised away), so the scheduler's batches of
    any size run it. NotConvertible, with torch's first line, when torch.export cannot convert it."""
    buf = io.BytesIO()
    if not isinstance(example, torch.Tensor) or example.dim() < 1:
        raise NotConvertible("faas-gpu: the example input must be a tensor with a batch dimension, e.g. (1, 3, 32, 32)")
    ex = example[:1].expand(2, *example.shape[1:]).clone()
    batch = torch.export.Dim("batch", min=1, max=4096)
    try:
        program = torch.export.export(module, (ex,), dynamic_shapes=({0: batch},))
        torch.export.save(program, buf)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise NotConvertible(
            f"faas-gpu: the model ({type(module).__name__}) cannot run on the GPU path: torch.export could not "
            f"convert it{' ' + where if where else ''} ({type(exc).__name__}: {first})"
        ) from exc
    return buf.getvalue()


SOURCE_FOLDER_FILES = 50
"""A class's folder whose .py files are all hashed into a source digest (a function's handler folder);
a larger one (a library's) contributes the class's own file only."""


def source_digest(module: torch.nn.Module, example: torch.Tensor) -> str | None:
    """The SHA-256 of what `export_program(module, example)` is made from, or None when it cannot
    be told (a tensor whose bytes cannot be read): the torch version, the input's shape (without
    the batch) and dtype, the module's mode, the code of every submodule's class (the file that
    defines it, with the other .py files of a function-sized folder beside it, which a forward may
    call into; torch's own classes by name, the torch version standing for their code), and every
    parameter and buffer byte. Two replicas that would export the same program compute the same
    digest, so a later one can ask the scheduler for the artifact an earlier one uploaded instead
    of exporting again (`scheduler.sources`): the export is seconds of every cold start.

    What it cannot see is code a forward reaches outside those files (a pip package's function);
    a new version of such code without a change to the model's own files keeps the old artifact."""
    digest = hashlib.sha256()
    digest.update(f"faas-gpu source/1 torch {torch.__version__}\n".encode())
    digest.update(f"input {tuple(example.shape[1:])} {example.dtype}; training {module.training}\n".encode())
    files: set[Path] = set()
    for sub in module.modules():
        cls = type(sub)
        digest.update(f"class {cls.__module__}.{cls.__qualname__}\n".encode())
        if cls.__module__.split(".")[0] == "torch":
            continue
        file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if file:
            here = Path(file)
            siblings = sorted(here.parent.glob("*.py"))
            files.update(siblings if len(siblings) <= SOURCE_FOLDER_FILES else [here])
    for path in sorted(files):
        try:
            digest.update(f"file {path.name}\n".encode() + path.read_bytes())
        except OSError:
            return None
    try:
        for name, t in module.state_dict().items():
            t = t.detach().cpu().contiguous()
            digest.update(f"tensor {name} {t.dtype} {tuple(t.shape)}\n".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    except (RuntimeError, TypeError, AttributeError):  # a quantized or otherwise unreadable tensor
        return None
    return digest.hexdigest()


def save_model(module: torch.nn.Module, example: torch.Tensor, path: str | os.PathLike) -> Path:
    """Save `module` the way python3-gpu loads it: a torch.export program with a dynamic batch
    dimension (`example`: one input batch, e.g. torch.randn(1, 3, 32, 32)), checked with the GPU
    Managers' own rules before it is written, so a refusal comes here rather than at the first
    call. The handler loads it with `torch.export.load(path).module()`; no class of the helper
    script is needed there (the program is data, not a pickle of the script's classes).

    NotConvertible (what failed and what to do instead) when it cannot be exported."""
    was_training = module.training
    module.eval()
    try:
        data = export_program(module, example, where="")
    except NotConvertible as exc:
        raise NotConvertible(
            f"{exc}; make forward traceable (no Python `if` on tensor values: torch.cond), or ship a state dict "
            f"or safetensors and build the module in the handler with faas_gpu.remote(module)"
        ) from exc.__cause__
    finally:
        module.train(was_training)
    check_sendable(data, type(module).__name__)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)  # replicas starting while it is written never read half a file
    finally:
        tmp.unlink(missing_ok=True)
    return path


def explain_pickle(data: bytes, name: str = "the file") -> str | None:
    """What to tell the handler's author when `data` is a `torch.save` pickle of a whole model
    (None for anything else: a state dict, a tensor, a program). Read from the pickle's opcodes,
    never unpickled."""
    try:
        top = pickled_class(Archive(io.BytesIO(data)))
    except (ArtifactError, ArtifactTooLarge, OSError):  # not an archive this reader takes: nothing to explain
        return None
    if top is None or top.startswith(("collections.", "builtins.", "torch._utils.", "torch.Tensor")):
        return None
    module, _, cls = top.rpartition(".")
    how = (
        f"Save it instead with faas_gpu.save_model(model, example_input, '{Path(name).stem}.pt2') in the script "
        f"that made it (a torch.export program: no class needed to load it) and load it in the handler with "
        f"torch.export.load('{Path(name).stem}.pt2').module(); or save model.state_dict(), build {cls} in the "
        f"handler from the handler's own module (from .{module.rsplit('.', 1)[-1]} import {cls}) and load the "
        f"weights with torch.load(..., weights_only=True)"
    )
    if module.startswith("torch."):
        return (
            f"faas-gpu: {name} is a pickled whole model ({top}); torch.load refuses it by default "
            f"(weights_only=True) and the GPU path never takes a pickle. {how}"
        )
    where = "the script that saved it ('__main__')" if module == "__main__" else f"module '{module}'"
    return (
        f"faas-gpu: {name} is a pickled module whose class lives in {where} ({cls}); the handler runs as the "
        f"package 'function', where that module is not importable under that name, and the GPU path never "
        f"takes a pickle. {how}"
    )


def check_sendable(artifact: bytes, what: str) -> BatchLimits:
    """The managers' own checks, here: a refused artifact is the handler's error, with what to do;
    else the batch it accepts (`faas_gpu.models.batch_limits`), as the managers will read it."""
    try:
        return detect(Archive(io.BytesIO(artifact)))[1]
    except (ArtifactError, ArtifactTooLarge) as exc:
        raise NotConvertible(
            f"faas-gpu: the model ({what}) cannot be sent to the GPU path: {exc}; {HOW_TO_SAVE}"
        ) from None
