"""A model worker's load path: artifact to model on its device, timed part by part, then warmed up.

Runs inside the worker process (never the manager), behind its walls (`isolation.py`), after
`safe_formats` checked the archive, through the one reader torch's input is held to
(`faas_gpu.models.archive`: the store's canonical archives only).
Each part is timed for `LoadedInfo`, so a slow miss says where its time went:

- **read**: the archive to a model in host memory. Both formats are zips whose members torch
  stores uncompressed; torch's C++ archive reader (`PyTorchFileReader`, behind `torch.jit.load`
  and `torch.export.load`) reads each weight record straight into the tensor's storage: one
  copy, from the page cache. torch.export's deserializer costs a fixed ~0.35 s per program on
  top (fake-tensor metadata, sympy, JSON to dataclasses), so a pooled worker **parses** the
  node's programs ahead (`parse`: the module without its weights) and the miss only binds them
  (`fill`, `weights.py`): on the cpu back end the weights are the store's pages mapped
  read-only and populated (no copy, no page faults left for the first batch; a clean page the
  kernel reclaims under memory pressure is read again from the store); on a GPU, one copy
  through pinned buffers.
- **to_device**: `torch.export.passes.move_to_device_pass` for export programs (finding 3:
  `.module().to(device)` moved parameters, but not devices burnt into graph nodes, such as
  `arange(..., device='cpu')`, nor the example inputs), `map_location` for TorchScript.
- **warmup**: one batch of the program's own example input (saved with it by
  `torch.export.save`) before the worker reports ready (finding 9), so the first real batch
  does not pay lazy kernel loading and cuBLAS/cuDNN set-up, and the manager's and scheduler's
  execution-time averages never see it. TorchScript archives carry no example input: their
  warm-up is skipped and the reason reported.

`prewarm()` is what a pooled worker runs while it waits for a model (see `pool.py`), and
`parse()` what it runs for each program the pool names while it waits.

`prepare()` and `finish()` split the same load in two for a **prepared** worker (`pool.py`'s
host-memory tier): `prepare` does the read (checks, torch's loader, the module built and its graph
checked) into host memory without touching CUDA, ahead of any miss; `finish`, on the miss, is
the copy to the device (with the device pass, and the module rebuilt from the moved program on a
GPU) and nothing else. On the cpu back end `finish` has nothing to do: the prepared module is the
model.
"""

from __future__ import annotations

import io
import logging
import os
import time
import typing
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """A model on its device, with the load's parts in seconds."""

    model: Any
    fmt: str
    read_s: float
    to_device_s: float
    example: tuple | None  # positional example inputs on the device, None when the artifact has none
    warmup_s: float = 0.0
    warmup_skipped: str | None = None  # why no warm-up batch ran
    parsed: bool = False  # bound into a skeleton parsed ahead (`fill`): the read was the weights alone
    optimize_s: float = 0.0
    optimized: tuple[str, ...] = ()  # the inference rewrites kept (`optimize.py`)
    optimize_skipped: str | None = None  # why none was, when none was


def _force_weights_only() -> None:
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # any torch.load inside torch's own loaders


@contextmanager
def _cached_type_hints() -> Iterator[None]:
    """`torch.export.load` turns its JSON into dataclasses calling `typing.get_type_hints` once
    per object (thousands per program, ~a third of the load on the embed example); the schema's
    classes do not change while it runs, so the answers are memoised for the load's duration
    only, and the original is put back after."""
    original = typing.get_type_hints
    seen: dict[tuple, Any] = {}

    def cached(obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False) -> Any:
        key = (obj, id(globalns), id(localns), include_extras)
        try:
            return seen[key]
        except KeyError:
            seen[key] = hints = original(obj, globalns, localns, include_extras)
            return hints
        except TypeError:  # an unhashable object: asked as usual
            return original(obj, globalns, localns, include_extras)

    typing.get_type_hints = cached
    try:
        yield
    finally:
        typing.get_type_hints = original


def _read_ahead(path: str) -> None:
    """Ask the kernel to start reading the whole file now: on a cold page cache the disk reads
    while the archive is checked and the graph parsed, not only when torch reaches the weights."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError):  # no fadvise here: the reads are merely not overlapped
        pass


def checked_format(path: str) -> str:
    """The artifact's format, read with the one strict reader torch's input is held to
    (`faas_gpu.models.archive`) and checked (`safe_formats`) before torch opens the file. Only a
    canonical archive is loaded (one entry a name, each where the last ended, nothing between):
    the store keeps no other kind, so one here was put there by other means."""
    from faas_gpu.contract.errors import ArtifactError
    from faas_gpu.models import safe_formats
    from faas_gpu.models.archive import Archive

    with open(path, "rb") as fh:
        archive = Archive(fh)
        if not archive.canonical:
            raise ArtifactError("artifact: not in the store's canonical form; refused before torch opens it")
        return safe_formats.detect_format(archive)


def load(path: str, device: str) -> Loaded:
    """Checked before torch opens it (the format comes from the file, not from the caller), and
    the loaded graphs checked before the first call; no `weights_only=False` path exists here."""
    _force_weights_only()
    import torch

    from faas_gpu.models import safe_formats

    t0 = time.perf_counter()
    _read_ahead(path)
    fmt = checked_format(path)  # ArtifactError for a pickle, an ambiguous archive or anything unsafe
    if fmt == "torchscript":  # an old artifact its owner chose: torch's deprecation is theirs, not this log's
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
            model = torch.jit.load(path, map_location=device)  # read straight onto the device
        safe_formats.check_torchscript(model)
        model.eval()
        t1 = time.perf_counter()
        return Loaded(model, fmt, t1 - t0, 0.0, None)
    # torch's C++ archive reader fills each weight's storage from the file (a file object: the store
    # names files by digest, and torch.export.load wants a path to end in .pt2)
    with open(path, "rb") as fh, _cached_type_hints():
        program = torch.export.load(fh)
    t1 = time.perf_counter()
    program = move_to_device(program, device)
    t2 = time.perf_counter()
    model, example = _runnable(program)
    # read: the archive to a module (checks, torch's loader, the module built from the graph)
    return Loaded(model, fmt, time.perf_counter() - t0 - (t2 - t1), t2 - t1, example)


@dataclass
class Prepared:
    """An artifact checked and read into host memory, nothing on a device: what `finish` needs."""

    fmt: str
    program: Any  # the ExportedProgram on the cpu (None for TorchScript)
    module: Any  # the program's module on the cpu, its graph checked; or the TorchScript module on the cpu
    example: tuple | None
    data: bytes | None  # a TorchScript archive's bytes (loaded again onto a GPU: it has no device pass)
    read_s: float


def prepare(path: str) -> Prepared:
    """The read of `load`, done ahead in host memory: the same checks before torch opens the file,
    no device touched (CUDA is not initialised: a prepared worker holds no context)."""
    _force_weights_only()
    import torch

    from faas_gpu.models import safe_formats

    t0 = time.perf_counter()
    _read_ahead(path)
    fmt = checked_format(path)  # ArtifactError for a pickle, an ambiguous archive or anything unsafe
    if fmt == "torchscript":
        with open(path, "rb") as fh:
            data = fh.read()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
            model = torch.jit.load(io.BytesIO(data), map_location="cpu")
        safe_formats.check_torchscript(model)
        model.eval()
        return Prepared(fmt, None, model, None, data, time.perf_counter() - t0)
    with open(path, "rb") as fh, _cached_type_hints():
        program = torch.export.load(fh)
    module = program.module(check_guards=False)  # check_guards=False: torch would exec guard code built from the file
    safe_formats.check_graph(module)
    example = None
    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        example = None if kwargs else tuple(args)
    return Prepared(fmt, program, module, example, None, time.perf_counter() - t0)


def finish(prepared: Prepared, device: str) -> Loaded:
    """A prepared model onto its device: the miss's only work before the warm-up (read_s 0: the
    read was done ahead). An export program goes through the device pass (finding 3) and its
    module is built again from the moved program (its graph checked again); a TorchScript archive
    is loaded again from its bytes in memory with `map_location` (it has no device pass)."""
    import torch

    from faas_gpu.models import safe_formats

    t0 = time.perf_counter()
    if prepared.fmt == "torchscript":
        model = prepared.module
        if device != "cpu":
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
                model = torch.jit.load(io.BytesIO(prepared.data), map_location=device)
            safe_formats.check_torchscript(model)
            model.eval()
        return Loaded(model, prepared.fmt, 0.0, time.perf_counter() - t0, None)
    model, example = prepared.module, prepared.example
    if not _devices(prepared.program) <= {torch.device(device)}:  # a GPU (the pass moves the program in place)
        model, example = _runnable(move_to_device(prepared.program, device))
    prepared.program = prepared.module = None  # the host copies go with the miss (a GPU holds the weights now)
    return Loaded(model, prepared.fmt, 0.0, time.perf_counter() - t0, example)


@dataclass
class Skeleton:
    """A program parsed ahead by a pooled worker, without its weights (`weights.py`): the module
    (graph checked, tensors on the meta device), where each tensor lies in the archive, and the
    example input on the cpu. A miss binds the weights (`fill`) and pays no parse."""

    path: str
    module: Any
    slots: list
    example: tuple | None
    parse_s: float


def parse(path: str) -> Skeleton:
    """torch's own load of the program (the same checks as `load` before torch opens the file),
    its module built and checked, then its tensors planned and dropped. CUDA is not touched.
    Raises `weights.Unplannable` for what cannot be bound from the archive (TorchScript, or a
    tensor torch did not read from a plain record): such a model is loaded as before."""
    _force_weights_only()
    import torch

    from . import weights

    t0 = time.perf_counter()
    fmt = checked_format(path)  # ArtifactError for a pickle, an ambiguous archive or anything unsafe
    if fmt != "export":
        raise weights.Unplannable(f"a {fmt} archive (only torch.export programs are parsed ahead)")
    with open(path, "rb") as fh, _cached_type_hints():
        program = torch.export.load(fh)
    if not _devices(program) <= {torch.device("cpu")}:
        raise weights.Unplannable("a program saved on a device (its records are read as the cpu's)")
    model, example = _runnable(program)
    slots = weights.plan(program, model, path)
    weights.strip(model, slots)
    return Skeleton(path, model, slots, example, time.perf_counter() - t0)


def fill(skeleton: Skeleton, device: str) -> Loaded:
    """A skeleton's weights from the store onto `device` (`weights.bind`): the miss's read is the
    mapping (cpu) or the copy to the GPU, and the graph's burnt-in devices are moved (finding 3)."""
    import torch

    from . import weights

    read_s, to_device_s = weights.bind(skeleton.module, skeleton.slots, skeleton.path, device)
    t0 = time.perf_counter()
    example = skeleton.example
    if device != "cpu":
        _move_graph(skeleton.module, device)
        if example is not None:
            example = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in example)
    to_device_s += time.perf_counter() - t0
    model, skeleton.module, skeleton.slots = skeleton.module, None, None  # consumed: the worker's model now
    return Loaded(model, "export", read_s, to_device_s, example, parsed=True)


def _runnable(program: Any) -> tuple[Any, tuple | None]:
    """An export program's module, its graph checked before any call, and its positional example
    inputs (None when it has none, or keyword ones). check_guards=False: torch would exec guard
    code built from the file."""
    from faas_gpu.models import safe_formats

    model = program.module(check_guards=False)
    safe_formats.check_graph(model)
    example = None
    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        example = None if kwargs else tuple(args)
    return model, example


def move_to_device(program: Any, device: str) -> Any:
    """The whole program on `device` (finding 3): weights, constants, example inputs, and the
    devices written into graph nodes (`arange(..., device='cpu')`, `aten.to.device`)."""
    import torch
    from torch.export.passes import move_to_device_pass

    if _devices(program) <= {torch.device(device)}:  # all there already (a cpu program on the cpu back end)
        return program
    return move_to_device_pass(program, device)


def _move_graph(module: Any, device: str) -> None:
    """The devices burnt into a module's graph nodes moved to `device`, as `move_to_device_pass`
    moves a program's (`arange(..., device='cpu')`, `aten.to.device`), then its code regenerated."""
    import torch

    for sub in module.modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        changed = False
        for node in sub.graph.nodes:
            if node.kwargs.get("device") is not None:
                node.kwargs = {**node.kwargs, "device": torch.device(device)}
                changed = True
            if node.op == "call_function" and node.target is torch.ops.aten.to.device:
                node.args = (node.args[0], torch.device(device), *node.args[2:])
                changed = True
        if changed:
            sub.recompile()


def _devices(program: Any) -> set:
    """Every device the program names: weights, constants, example inputs, graph nodes."""
    import torch

    found = {t.device for t in program.state_dict.values()}
    found |= {t.device for t in program.constants.values() if isinstance(t, torch.Tensor)}
    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        leaves = [*torch.utils._pytree.tree_leaves(args), *torch.utils._pytree.tree_leaves(kwargs)]
        found |= {t.device for t in leaves if isinstance(t, torch.Tensor)}
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if "device" in node.kwargs:
                    found.add(torch.device(node.kwargs["device"]) if node.kwargs["device"] is not None else None)
                if node.op == "call_function" and node.target is torch.ops.aten.to.device:
                    found.add(torch.device(node.args[1]))
    return found


def ready(loaded: Loaded, device: str) -> Loaded:
    """A loaded model made ready to serve: rewritten for inference where that is safe and checked
    (`optimize.py`; the worker's environment can turn it off), then warmed up, so the warm-up
    batch already runs the kernels the real batches will."""
    from . import optimize

    t0 = time.perf_counter()
    done = optimize.for_inference(
        loaded.model, loaded.example, device, enabled=os.environ.get(optimize.ENV, "1") != "0"
    )
    loaded.optimize_s = time.perf_counter() - t0
    loaded.optimized, loaded.optimize_skipped = tuple(done.applied), done.skipped
    if done.applied:
        log.info("worker: model rewritten for inference: %s", ", ".join(done.applied))
    remember_input_checks(loaded.model)
    return warm_up(loaded, device)


INPUT_SHAPES_REMEMBERED = 256
"""Input shapes whose check passed, remembered per model (a model fed ever new shapes is checked
each call beyond these)."""


def remember_input_checks(model: Any) -> bool:
    """torch.export's check of each call's inputs against the program (`program.module()`'s
    forward pre-hook: the inputs' structure, and each dimension within its range) made once per
    input signature rather than on every batch: it depends only on the inputs' structure, shapes,
    dtypes and devices, and cost ~60 us a batch, as much as decoding it (issue 20). A signature
    whose check failed is checked again every time, so its error is raised as before. False when
    the model has no such hook (TorchScript, another torch's module)."""
    from torch.export import _unlift

    check = getattr(_unlift, "_check_input_constraints_pre_hook", None)
    hooks = getattr(model, "_forward_pre_hooks", None)
    if check is None or not hooks:
        return False
    found = [key for key, hook in hooks.items() if hook is check]
    if not found:
        return False
    passed: set[tuple] = set()

    def remembered(module: Any, args: tuple, kwargs: dict) -> None:
        key = _signature(args, kwargs)
        if key is not None and key in passed:
            return None
        check(module, args, kwargs)
        if key is not None and len(passed) < INPUT_SHAPES_REMEMBERED:
            passed.add(key)
        return None

    for key in found:
        hooks[key] = remembered
    return True


def _signature(args: tuple, kwargs: dict) -> tuple | None:
    """What the input check depends on, for positional tensors only (None otherwise: not remembered)."""
    import torch

    if kwargs or not all(type(a) is torch.Tensor for a in args):
        return None
    return tuple((tuple(a.shape), a.dtype, a.device) for a in args)


def warm_up(loaded: Loaded, device: str) -> Loaded:
    """One batch of the artifact's example input before the worker is ready (finding 9)."""
    import torch

    if loaded.example is None:
        loaded.warmup_skipped = (
            "a TorchScript archive carries no example input"
            if loaded.fmt == "torchscript"
            else "the program was saved without an example input (or with keyword inputs)"
        )
        log.info("worker: no warm-up batch: %s", loaded.warmup_skipped)
        return loaded
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            loaded.model(*loaded.example)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as exc:
        from . import faults

        if faults.classify(exc) in (faults.OOM, faults.DEVICE):  # the load fails as such (507/503, replaced)
            raise
        # the example itself fails (an input error): the first real batch will tell the caller
        loaded.warmup_skipped = f"the example input failed: {type(exc).__name__}: {exc}"
        log.warning("worker: warm-up batch failed: %s", exc)
    loaded.warmup_s = time.perf_counter() - t0
    return loaded


def prewarm() -> None:
    """What a pooled worker does while it waits: import and run torch's export loader once on a
    tiny program made here (from this code, not from a file), so a model's load later pays
    neither the imports nor their first-use set-up (~1.3 s of a 1.9 s embed load measured here).
    Touches no GPU: CUDA is not initialised, so the unit's environment still applies."""
    _force_weights_only()
    import torch

    import faas_gpu.contract.wire  # noqa: F401  (the serve loop's codec)
    from faas_gpu.models import safe_formats  # noqa: F401

    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    with _cached_type_hints():
        loaded = torch.export.load(buf)
    move_to_device(loaded, "cpu").module(check_guards=False)(torch.zeros(1, 2))
