"""A parsed program's weights bound straight from the node's store, without torch's loader.

torch.export's loader costs a fixed ~0.35 s per program (its deserializer: fake-tensor metadata,
sympy, JSON to dataclasses), against ~50 ms of weights for the 90 MB embed model: a miss that
parses can never approach the store's bandwidth. So a warm pooled worker parses the node's
programs ahead (`loader.parse`) and keeps each as a **skeleton**: the module, its graph checked,
with its tensors on the meta device, and a `Slot` per tensor saying where its bytes lie in the
archive. At the miss (`bind`) only the weights are read:

- **cpu**: the archive is mapped read-only (`MAP_PRIVATE | MAP_POPULATE`, the pages the store's
  page cache already holds, mapped, not copied) and each weight is a view of its record, as
  safetensors and llama.cpp load. A mapping with write access would copy every page at populate
  (measured here: 46 ms for 90 MB against 2 ms read-only), so the mapping is read-only, and the
  tensors a program writes (its `buffers_to_mutate`) are copied into memory of their own. The
  store never rewrites a file in place (a new artifact is a new digest, renamed in whole), so a
  mapping always sees the bytes it was planned on. Clean mapped pages count in the worker's USS
  while it alone maps them, as its weights should.
- **a GPU**: each record is copied to device memory through two reused pinned host buffers
  (`copy_chunked`), so the host copy of one chunk overlaps the DMA of the one before, from pages
  the mapping did not copy.

A plan is made from torch's own load of the same file and checked against it byte for byte
(`plan`), so the offsets read here are never a second interpretation of the format that could
drift from torch's.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from faas_gpu.models.archive import Archive
from faas_gpu.models.safe_formats import TEXT_BYTES

STAGING_BYTES = 32 << 20  # each of the two pinned buffers of a copy to a GPU


class Unplannable(Exception):
    """The program's tensors cannot be bound from the archive (the worker loads it with torch's loader)."""


@dataclass(frozen=True)
class Slot:
    """One tensor of a skeleton's module: where it lives in the module and in the archive."""

    owner: str  # the submodule's dotted path ("" for the root)
    name: str  # its attribute there
    kind: str  # "parameter", "buffer" or "attribute" (a lifted constant)
    member: str  # the archive record holding its storage
    dtype: Any
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int  # in elements
    requires_grad: bool
    private: bool  # the program writes it: copied, not mapped


def members(path: str) -> dict[str, tuple[int, int]]:
    """Each stored (uncompressed) member's (offset of its data, size) in the file, as the one
    strict reader (`faas_gpu.models.archive`) found them: the offsets torch reads too, since the
    store keeps only canonical archives (one entry a name, each right after the one before)."""
    with open(path, "rb") as fh:
        archive = Archive(fh)
        return {e.name: (e.data_offset, e.size) for e in archive.entries if e.method == 0}


def _config(z: Archive, name: str) -> dict[str, Any]:
    import json

    if name not in z:
        return {}
    return json.loads(z.read(name, TEXT_BYTES)).get("config") or {}


def module_tensors(module: Any) -> Iterator[tuple[str, str, str, Any]]:
    """(owner, name, kind, tensor) for every tensor the module holds: parameters, buffers, and
    plain tensor attributes (the constants torch's unlifting sets with setattr)."""
    import torch

    for owner, sub in module.named_modules(remove_duplicate=False):
        for name, t in sub._parameters.items():
            if t is not None:
                yield owner, name, "parameter", t
        for name, t in sub._buffers.items():
            if t is not None:
                yield owner, name, "buffer", t
        for name, t in vars(sub).items():
            if isinstance(t, torch.Tensor) and name not in sub._parameters and name not in sub._buffers:
                yield owner, name, "attribute", t


def plan(program: Any, module: Any, path: str) -> list[Slot]:
    """The slots of `module` (torch's `program.module()` of the archive at `path`): each tensor
    traced to the record its storage was read from (torch reads one storage per record, so the
    storage identifies it), then every slot checked against torch's tensor byte for byte."""
    import torch

    with open(path, "rb") as fh:
        z = Archive(fh)
        names = z.names()
        prefix = next((n[: -len("archive_format")] for n in names if n.endswith("archive_format")), None)
        if prefix is None:
            raise Unplannable("not a torch.export archive")
        configs = {
            "weights": _config(z, f"{prefix}data/weights/model_weights_config.json"),
            "constants": _config(z, f"{prefix}data/constants/model_constants_config.json"),
        }
    records: dict[int, str] = {}  # storage address -> record
    for dir_, tensors in (("weights", program.state_dict), ("constants", program.constants)):
        for fqn, t in tensors.items():
            meta = configs[dir_].get(fqn)
            if not isinstance(t, torch.Tensor) or meta is None or meta.get("use_pickle") is not False:
                raise Unplannable(f"{dir_} {fqn}: no plain record in the archive")
            records[t.untyped_storage().data_ptr()] = f"{prefix}data/{dir_}/{meta['path_name']}"
    mutated = {
        program.state_dict[fqn].untyped_storage().data_ptr()
        for fqn in program.graph_signature.buffers_to_mutate.values()
        if fqn in program.state_dict
    }
    written = written_attributes(module)
    mutated |= {t.untyped_storage().data_ptr() for o, n, _k, t in module_tensors(module) if _dotted(o, n) in written}
    where = members(path)
    slots = []
    for owner, name, kind, t in module_tensors(module):
        ptr = t.untyped_storage().data_ptr()
        member = records.get(ptr)
        if member is None or member not in where:
            raise Unplannable(f"{owner + '.' if owner else ''}{name}: not read from a stored record")
        if t.device.type != "cpu" or t.layout != torch.strided:
            raise Unplannable(f"{owner}.{name}: a {t.device} {t.layout} tensor")
        slots.append(
            Slot(
                owner,
                name,
                kind,
                member,
                t.dtype,
                tuple(t.shape),
                tuple(t.stride()),
                t.storage_offset(),
                bool(t.requires_grad),
                ptr in mutated,
            )
        )
    mapped = MappedArchive(path)
    for (owner, name, _kind, t), view in zip(module_tensors(module), mapped.views(slots, where), strict=True):
        if view.shape != t.shape or not torch.equal(_bytes(view), _bytes(t.detach())):
            raise Unplannable(f"{owner}.{name}: the record's bytes are not torch's tensor")
    return slots


def _bytes(t: Any) -> Any:
    """A tensor's values as bytes (`torch.equal` on floats says NaN != NaN)."""
    import torch

    return t.reshape(-1).contiguous().view(torch.uint8)


def _dotted(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def written_attributes(module: Any) -> set[str]:
    """The module's tensors its graph writes in place: every argument an op's schema marks written
    (`add_`, `copy_`, ...), followed back through views (ops whose result aliases an input) to the
    attribute it is a view of. torch.export's default IR keeps such writes in the graph rather
    than list them in `buffers_to_mutate`; a write into a read-only mapping would kill the worker,
    so these are copied. A write inside a nested graph (a control-flow op's branch) to one of its
    inputs cannot be traced to an attribute here: such a program is not planned."""
    import torch

    written: set[str] = set()
    for prefix, sub in module.named_modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            for i, arg in enumerate(node.target._schema.arguments):
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
                for base in _bases(value):
                    if base.op == "get_attr":
                        written.add(f"{prefix}.{base.target}" if prefix else str(base.target))
                    elif base.op == "placeholder" and prefix:
                        raise Unplannable(f"{prefix}: a nested graph writes its input {base.name}")
    return written


def _bases(value: Any) -> Iterator[Any]:
    """The nodes `value` (a node, or a list of them) is a view of: itself unless made by a view op."""
    import torch

    if isinstance(value, list | tuple):
        for v in value:
            yield from _bases(v)
        return
    if not isinstance(value, torch.fx.Node):
        return
    target = value.target
    if value.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        if any(r.alias_info is not None for r in schema.returns):
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and i < len(value.args):
                    yield from _bases(value.args[i])
            return
    if value.op == "call_function" and getattr(target, "__name__", "") == "getitem":
        yield from _bases(value.args[0])
        return
    yield value


def strip(module: Any, slots: list[Slot]) -> None:
    """Every slot's tensor replaced by a meta tensor of its shape: the skeleton holds no weights."""
    import torch

    for slot in slots:
        meta = torch.empty_strided(slot.size, slot.stride, dtype=slot.dtype, device="meta")
        _assign(module, slot, meta)


def _assign(module: Any, slot: Slot, t: Any) -> None:
    import torch

    sub = module.get_submodule(slot.owner) if slot.owner else module
    if slot.kind == "parameter":
        sub._parameters[slot.name] = torch.nn.Parameter(t, requires_grad=slot.requires_grad)
    elif slot.kind == "buffer":
        sub._buffers[slot.name] = t
    else:
        object.__setattr__(sub, slot.name, t)  # not nn.Module's __setattr__: it would not register a plain tensor


class MappedArchive:
    """The archive mapped read-only, populated from the page cache (no copy), as one uint8 tensor."""

    def __init__(self, path: str):
        import torch

        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
        with warnings.catch_warnings():  # torch warns of a read-only buffer: only `private` slots are written
            warnings.filterwarnings("ignore", message=r".*not writable.*")
            self.data = torch.frombuffer(self._map, dtype=torch.uint8) if self._map is not None else torch.empty(0)

    def record(self, where: dict[str, tuple[int, int]], member: str) -> Any:
        offset, size = where[member]
        return self.data[offset : offset + size]

    def views(self, slots: list[Slot], where: dict[str, tuple[int, int]]) -> Iterator[Any]:
        """Each slot's tensor as a view of its record (a copy where the record is misaligned for its dtype)."""
        for slot in slots:
            yield _view(self.record(where, slot.member), slot)


def _view(record: Any, slot: Slot) -> Any:
    """A slot's tensor over the bytes of its record (on whatever device the record is)."""
    import torch

    itemsize = torch.empty(0, dtype=slot.dtype).element_size()
    if record.numel() % itemsize:
        raise Unplannable(f"{slot.member}: {record.numel()} bytes is no whole number of {slot.dtype}")
    if record.data_ptr() % itemsize:  # torch aligns records to 64 bytes; copy rather than fail otherwise
        record = record.clone()
    flat = record.view(slot.dtype)  # as_strided's offset is the storage's, not the view's: add the record's
    return torch.as_strided(flat, slot.size, slot.stride, flat.storage_offset() + slot.storage_offset)


def bind(
    module: Any,
    slots: list[Slot],
    path: str,
    device: str,
    copy: Callable[[Any, Any], None] | None = None,
) -> tuple[float, float]:
    """The weights of `path` into the skeleton's module on `device`: (read seconds, to-device
    seconds). On the cpu the slots are views of the mapping (the `private` ones copied); on a
    device each record is copied once, through `copy(src, dst)` (default `copy_chunked` with two
    pinned buffers), and the slots are views of the copy, so tensors sharing a record still share."""
    import time

    import torch

    t0 = time.perf_counter()
    where = members(path)
    mapped = MappedArchive(path)
    t1 = time.perf_counter()
    if device == "cpu":
        for slot, view in zip(slots, mapped.views(slots, where), strict=True):
            _assign(module, slot, view.clone() if slot.private else view)
        return time.perf_counter() - t0, 0.0
    largest = max((where[slot.member][1] for slot in slots), default=0)
    copy = copy or copier(device, max(1, min(STAGING_BYTES, largest)))  # a small model pins little
    on_device: dict[str, Any] = {}
    for slot in slots:
        if slot.member not in on_device:
            src = mapped.record(where, slot.member)
            dst = torch.empty(src.numel(), dtype=torch.uint8, device=device)
            copy(src, dst)
            on_device[slot.member] = dst
        _assign(module, slot, _view(on_device[slot.member], slot))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1


def copier(device: str, staging_bytes: int = STAGING_BYTES) -> Callable[[Any, Any], None]:
    """A copy function for `bind` on `device`: through two pinned buffers on a GPU (made once per
    load), a plain copy elsewhere."""
    import torch

    if not device.startswith("cuda"):
        return lambda src, dst: dst.copy_(src)
    buffers = [torch.empty(staging_bytes, dtype=torch.uint8).pin_memory() for _ in range(2)]
    events = [torch.cuda.Event() for _ in buffers]
    used = [False, False]

    def copy(src: Any, dst: Any) -> None:
        copy_chunked(src, dst, buffers, events, used)

    return copy


def copy_chunked(src: Any, dst: Any, buffers: list[Any], events: list[Any] | None, used: list[bool]) -> None:
    """src (host, pageable) -> dst in chunks through alternating `buffers`: each chunk is copied
    into a buffer (a host copy), then sent on asynchronously; a buffer is reused only once its
    last send finished (`events`: one per buffer, None where the sends are synchronous)."""
    size, chunk, i, n = src.numel(), buffers[0].numel(), 0, 0
    while n < size:
        k = min(chunk, size - n)
        buf = buffers[i]
        if events is not None and used[i]:
            events[i].synchronize()
        buf[:k].copy_(src[n : n + k])
        dst[n : n + k].copy_(buf[:k], non_blocking=events is not None)
        if events is not None:
            events[i].record()
        used[i] = True
        n += k
        i = 1 - i
