"""MIG geometry control through NVML: slice a GPU into the GPU instances a geometry names.

PROTEAN (seed 000, §2 and §4.4) reconfigures each GPU's *geometry* — the multiset of MIG
profiles it is sliced into, e.g. (4g, 3g) — when its Reconfigurator decides the request mix
calls for it; reconfiguring needs every slice idle. This module is the act, not the decision:
given a GPU index and a list of profile names, it reads the GPU's own GPU-instance profile
table (`nvmlDeviceGetGpuInstanceProfileInfoV` for each `NVML_GPU_INSTANCE_PROFILE_*`, with the
placements `nvmlDeviceGetGpuInstancePossiblePlacements` allows), validates the geometry
against it, plans the fewest changes from the current GPU instances (kept instances stay,
with their MIG device UUIDs), and applies the plan in a safe order: compute instances then GPU
instances destroyed, then GPU instances created at planned placements
(`nvmlDeviceCreateGpuInstanceWithPlacement`) each with one full-slice compute instance. It
never changes MIG mode (that needs a GPU reset and root): a GPU with MIG off is refused.

The NVML module is a parameter (`pynvml` by default) so that tests replace it at this boundary.
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# pynvml's names, in its order; getattr'd so that an older pynvml without the newest ones still works
GI_PROFILES = (
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_8_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_6_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX",
)
CI_PROFILES = (
    "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1",
)


class MigError(RuntimeError):
    """NVML refused a step of a reconfiguration (the message names the step)."""


class MigModeOff(MigError):
    """The GPU is not in MIG mode (or cannot be): enabling it is the operator's act, not ours."""

    def __init__(self, index: int, detail: str):
        super().__init__(
            f"gpu {index}: {detail}; MIG geometry needs MIG mode on "
            f"(an operator enables it with `nvidia-smi -i {index} -mig 1`; this manager never changes it)"
        )


class UnitsBusy(MigError):
    """Units of the GPU still run jobs (or processes): they must be drained first."""

    def __init__(self, index: int, units: list[str]):
        self.units = list(units)
        super().__init__(f"gpu {index}: units still busy, not drained: {', '.join(self.units)}")


class UnknownGPU(LookupError):
    pass


@dataclass(frozen=True)
class Profile:
    """A GPU-instance profile as this GPU reports it."""

    name: str  # "3g.20gb"
    id: int  # the profile id NVML creates instances of (not the NVML_GPU_INSTANCE_PROFILE_* constant)
    nvml_profile: str  # which NVML_GPU_INSTANCE_PROFILE_* it is, e.g. "3_SLICE"
    slices: int  # compute slices
    memory_mb: int
    max_count: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices
    multiprocessors: int = 0

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "id": self.id,
            "nvml_profile": self.nvml_profile,
            "slices": self.slices,
            "memory_mb": self.memory_mb,
            "max_count": self.max_count,
            "multiprocessors": self.multiprocessors,
            "placements": [{"start": s, "size": z} for s, z in self.placements],
        }


@dataclass(frozen=True)
class Instance:
    """A GPU instance that exists now, with its compute instances."""

    id: int
    profile: str
    start: int
    size: int
    compute: tuple[int, ...] = ()  # the slices of each compute instance
    handle: Any = field(default=None, compare=False, repr=False)
    ci_handles: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def reusable(self, profiles: dict[str, Profile]) -> bool:
        """One full-slice compute instance (a unit as we make them), or none yet (we add it)."""
        return self.compute in ((), (profiles[self.profile].slices,))


@dataclass(frozen=True)
class Plan:
    keep: tuple[Instance, ...]
    destroy: tuple[Instance, ...]
    create: tuple[tuple[Profile, int, int], ...]  # (profile, start, size), largest first

    @property
    def changes(self) -> bool:
        return bool(self.destroy or self.create or any(not i.compute for i in self.keep))


class InvalidGeometry(ValueError):
    """A geometry this GPU cannot take; carries what it can."""

    def __init__(self, index: int, reason: str, profiles: dict[str, Profile]):
        self.index, self.reason = index, reason
        self.valid_profiles = {p.name: p.max_count for p in _by_size(profiles)}
        self.valid_geometries = valid_geometries(profiles)
        counts = ", ".join(f"{n} (up to {c})" for n, c in self.valid_profiles.items()) or "none (MIG off?)"
        shown = " ".join(f"[{', '.join(g)}]" for g in self.valid_geometries[:12])
        more = f" … and {len(self.valid_geometries) - 12} more" if len(self.valid_geometries) > 12 else ""
        super().__init__(
            f"gpu {index}: invalid MIG geometry: {reason}. Profiles: {counts}. Valid full geometries: {shown}{more}"
        )

    def to_json(self) -> dict:
        return {
            "error": str(self),
            "gpu": self.index,
            "valid_profiles": self.valid_profiles,
            "valid_geometries": self.valid_geometries,
        }


# -- reading the GPU ------------------------------------------------------------------------


@contextmanager
def nvml_session(nvml: Any) -> Iterator[Any]:
    """nvmlInit … nvmlShutdown (NVML counts them, so sessions nest)."""
    nvml.nvmlInit()
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _code(exc: Exception) -> int | None:
    return getattr(exc, "value", None)


def handle(nvml: Any, index: int) -> Any:
    if not 0 <= index < nvml.nvmlDeviceGetCount():
        raise UnknownGPU(f"gpu {index}: not a GPU of this node")
    return nvml.nvmlDeviceGetHandleByIndex(index)


def mig_mode(nvml: Any, dev: Any) -> str:
    """'enabled', 'disabled', or 'unsupported' (not MIG-capable)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(dev)
    except nvml.NVMLError:
        return "unsupported"
    return "enabled" if current == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"


def _profile_name(info: Any) -> str:
    raw = _text(getattr(info, "name", b"")).strip()
    if raw:
        return raw.removeprefix("MIG ").strip()
    # a v1 struct (old driver) has no name: "<slices>g.<GB>gb" as nvidia-smi spells them
    return f"{info.sliceCount}g.{math.ceil(info.memorySizeMB / 1024)}gb"


def _placements(nvml: Any, dev: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(dev, profile_id, None, ctypes.byref(count))
    if count.value == 0:
        return ()
    buf = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(dev, profile_id, buf, ctypes.byref(count))
    return tuple((buf[i].start, buf[i].size) for i in range(count.value))


def read_profiles(nvml: Any, dev: Any) -> dict[str, Profile]:
    """The GPU's GPU-instance profiles by name (empty while MIG mode is off)."""
    unsupported = (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT)
    found: dict[str, Profile] = {}
    for const_name in GI_PROFILES:
        const = getattr(nvml, const_name, None)
        if const is None:
            continue
        try:
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, const)
            except nvml.NVMLError as exc:
                if _code(exc) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, const, version=1)  # driver < 510
        except nvml.NVMLError as exc:
            if _code(exc) in unsupported:
                continue
            raise
        if info.instanceCount == 0:
            continue
        name = _profile_name(info)
        if name in found:  # two profiles spelled alike: keep them apart
            name = f"{name}#{info.id}"
        found[name] = Profile(
            name=name,
            id=int(info.id),
            nvml_profile=const_name.removeprefix("NVML_GPU_INSTANCE_PROFILE_"),
            slices=int(info.sliceCount),
            memory_mb=int(info.memorySizeMB),
            max_count=int(info.instanceCount),
            placements=_placements(nvml, dev, info.id),
            multiprocessors=int(info.multiprocessorCount),
        )
    return found


def _ci_profiles(nvml: Any, gi: Any) -> list[tuple[int, int, int]]:
    """(profile id, slices, max count) of each compute-instance profile the GPU instance supports."""
    out = []
    for const_name in CI_PROFILES:
        const = getattr(nvml, const_name, None)
        if const is None:
            continue
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, const, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except nvml.NVMLError as exc:
            if _code(exc) in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        if info.instanceCount > 0:
            out.append((int(info.id), int(info.sliceCount), int(info.instanceCount)))
    return out


def _compute_instances(nvml: Any, gi: Any) -> list[tuple[Any, int]]:
    """(handle, slices) of the GPU instance's compute instances."""
    out = []
    for ci_id, slices, max_count in _ci_profiles(nvml, gi):
        buf = (nvml.c_nvmlComputeInstance_t * max_count)()
        count = ctypes.c_uint(max_count)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, ci_id, buf, ctypes.byref(count))
        out += [(buf[i], slices) for i in range(count.value)]
    return out


def current_instances(nvml: Any, dev: Any, profiles: dict[str, Profile]) -> list[Instance]:
    """The GPU instances that exist now, by placement."""
    out = []
    for p in profiles.values():
        buf = (nvml.c_nvmlGpuInstance_t * p.max_count)()
        count = ctypes.c_uint(p.max_count)
        nvml.nvmlDeviceGetGpuInstances(dev, p.id, buf, ctypes.byref(count))
        for i in range(count.value):
            gi = buf[i]
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            cis = _compute_instances(nvml, gi)
            out.append(
                Instance(
                    id=int(info.id),
                    profile=p.name,
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                    compute=tuple(sorted(s for _h, s in cis)),
                    handle=gi,
                    ci_handles=tuple(h for h, _s in cis),
                )
            )
    return sorted(out, key=lambda i: (i.start, i.id))


# -- planning (pure) ------------------------------------------------------------------------


def _by_size(profiles: dict[str, Profile]) -> list[Profile]:
    return sorted(profiles.values(), key=lambda p: (-p.slices, -p.memory_mb, p.name))


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _free(span: tuple[int, int], taken: list[tuple[int, int]]) -> bool:
    return all(not _overlaps(span, t) for t in taken)


def valid_geometries(profiles: dict[str, Profile]) -> list[list[str]]:
    """Every full geometry of the GPU: a packing to which no further instance can be added."""
    order = _by_size(profiles)
    found: set[tuple[str, ...]] = set()

    def grow(first: int, low: int, taken: list[tuple[int, int]], names: list[str]) -> None:
        # every packing once: instances in profile order, a profile's placements in increasing order
        found.add(tuple(names))
        for k in range(first, len(order)):
            p = order[k]
            if names.count(p.name) >= p.max_count:
                continue
            for j in range(low if k == first else 0, len(p.placements)):
                if _free(p.placements[j], taken):
                    grow(k, j + 1, [*taken, p.placements[j]], [*names, p.name])

    grow(0, 0, [], [])
    rank = {p.name: i for i, p in enumerate(order)}

    def bigger(g: tuple[str, ...], extra: str) -> tuple[str, ...]:
        return tuple(sorted([*g, extra], key=lambda n: rank[n]))

    full = [g for g in found if g and not any(bigger(g, p.name) in found for p in order)]
    return [list(g) for g in sorted(full, key=lambda g: [rank[n] for n in g])]


def plan_geometry(profiles: dict[str, Profile], current: list[Instance], target: list[str], index: int = 0) -> Plan:
    """The plan that reaches `target` keeping the most current GPU instances; InvalidGeometry if none."""
    unknown = [n for n in target if n not in profiles]
    if unknown:
        raise InvalidGeometry(index, f"unknown profile(s) {', '.join(map(repr, unknown))}", profiles)
    counts = Counter(target)
    over = [f"{n} x{c} (at most {profiles[n].max_count})" for n, c in counts.items() if c > profiles[n].max_count]
    if over:
        raise InvalidGeometry(index, f"too many instances: {', '.join(over)}", profiles)
    rank = {p.name: i for i, p in enumerate(_by_size(profiles))}
    items = sorted(target, key=lambda n: rank[n])
    reusable = [i for i in current if i.reusable(profiles)]
    # per profile, the options: an existing instance to keep, or a placement to create at
    options: dict[str, list[tuple[Instance | None, tuple[int, int]]]] = {
        n: [(i, (i.start, i.size)) for i in reusable if i.profile == n]
        + [(None, span) for span in profiles[n].placements]
        for n in counts
    }
    best: list[tuple[Instance | None, tuple[int, int]]] | None = None
    best_kept = -1
    most = sum(min(c, len([i for i in reusable if i.profile == n])) for n, c in counts.items())

    def search(k: int, low: int, chosen: list[tuple[Instance | None, tuple[int, int]]]) -> bool:
        nonlocal best, best_kept
        if k == len(items):
            kept = sum(1 for inst, _ in chosen if inst is not None)
            if kept > best_kept:
                best, best_kept = list(chosen), kept
            return best_kept == most  # nothing can keep more: stop
        name = items[k]
        start = low if k > 0 and items[k - 1] == name else 0  # same profile: no permutations
        for j in range(start, len(options[name])):
            inst, span = options[name][j]
            if any(inst is not None and inst is other for other, _ in chosen):
                continue
            if _free(span, [s for _, s in chosen]) and search(k + 1, j + 1, [*chosen, (inst, span)]):
                return True
        return False

    search(0, 0, [])
    if best is None:
        raise InvalidGeometry(index, f"[{', '.join(items)}] do not fit together on this GPU", profiles)
    keep = tuple(inst for inst, _ in best if inst is not None)
    kept_ids = {i.id for i in keep}
    create = tuple((profiles[n], span[0], span[1]) for n, (inst, span) in zip(items, best, strict=True) if inst is None)
    return Plan(keep=keep, destroy=tuple(i for i in current if i.id not in kept_ids), create=create)


# -- acting ---------------------------------------------------------------------------------


def _full_compute_instance(nvml: Any, gi: Any) -> None:
    """One compute instance over all of the GPU instance's slices: the unit is the whole slice."""
    ci_id, _slices, _n = max(_ci_profiles(nvml, gi), key=lambda c: c[1])
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_id)


def _busy_processes(nvml: Any, dev: Any, gi_ids: set[int]) -> list[str]:
    """MIG devices (UUIDs) of those GPU instances that still have compute processes."""
    busy = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, slot)
            if nvml.nvmlDeviceGetGpuInstanceId(mig) not in gi_ids:
                continue
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(mig)
        except nvml.NVMLError:  # an empty slot, or no permission to see processes
            continue
        if procs:
            pids = ",".join(str(p.pid) for p in procs)
            busy.append(f"{_text(nvml.nvmlDeviceGetUUID(mig))} (pids {pids})")
    return busy


def _require_mig(nvml: Any, dev: Any, index: int) -> None:
    mode = mig_mode(nvml, dev)
    if mode != "enabled":
        raise MigModeOff(index, "MIG mode is off" if mode == "disabled" else "not MIG-capable")


def check_geometry(nvml: Any, index: int, target: list[str]) -> Plan:
    """The plan for `target`, without changing anything (InvalidGeometry, MigModeOff, UnknownGPU)."""
    with nvml_session(nvml):
        dev = handle(nvml, index)
        _require_mig(nvml, dev, index)
        profiles = read_profiles(nvml, dev)
        return plan_geometry(profiles, current_instances(nvml, dev, profiles), list(target), index)


def apply_geometry(
    nvml: Any,
    index: int,
    target: list[str],
    *,
    busy: Callable[[], list[str]] | None = None,
    settle_s: float = 5.0,
) -> list[str]:
    """Reach `target` on GPU `index`; returns the geometry now in place (profile names by placement).

    `busy` answers which of the GPU's units still run jobs: the manager's drain check. Any answer
    refuses the change (UnitsBusy) before anything is destroyed; so do processes NVML still sees
    on a GPU instance to destroy after `settle_s` (an MPS server takes a moment to exit).
    """
    target = list(target)
    with nvml_session(nvml):
        dev = handle(nvml, index)
        _require_mig(nvml, dev, index)
        profiles = read_profiles(nvml, dev)
        plan = plan_geometry(profiles, current_instances(nvml, dev, profiles), target, index)
        units = busy() if busy is not None else []
        if units:
            raise UnitsBusy(index, units)
        doomed = {i.id for i in plan.destroy}
        deadline = time.monotonic() + settle_s
        while doomed and (procs := _busy_processes(nvml, dev, doomed)):
            if time.monotonic() >= deadline:
                raise UnitsBusy(index, procs)
            time.sleep(0.1)
        step = "reading"
        try:
            for inst in plan.destroy:  # compute instances first: NVML refuses a GPU instance that has some
                step = f"destroying {inst.profile} (GPU instance {inst.id})"
                for ci in inst.ci_handles:
                    nvml.nvmlComputeInstanceDestroy(ci)
                nvml.nvmlGpuInstanceDestroy(inst.handle)
                log.info("gpu %d: destroyed %s at slice %d", index, inst.profile, inst.start)
            for inst in plan.keep:
                if not inst.compute:
                    step = f"adding a compute instance to {inst.profile} (GPU instance {inst.id})"
                    _full_compute_instance(nvml, inst.handle)
            for profile, start, size in plan.create:  # largest first, at the planned placements
                step = f"creating {profile.name} at slice {start}"
                placement = nvml.c_nvmlGpuInstancePlacement_t(start, size)
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile.id, ctypes.byref(placement))
                step = f"creating the compute instance of {profile.name} at slice {start}"
                _full_compute_instance(nvml, gi)
                log.info("gpu %d: created %s at slice %d", index, profile.name, start)
        except nvml.NVMLError as exc:
            raise MigError(f"gpu {index}: {step} failed: {type(exc).__name__}: {exc}") from exc
        return [i.profile for i in current_instances(nvml, dev, profiles)]


def describe_gpus(nvml: Any) -> list[dict]:
    """Every GPU: MIG mode, current geometry and instances, supported profiles ([] without a driver)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return []
    try:
        out = []
        for index in range(nvml.nvmlDeviceGetCount()):
            dev = nvml.nvmlDeviceGetHandleByIndex(index)
            mode = mig_mode(nvml, dev)
            profiles = read_profiles(nvml, dev) if mode == "enabled" else {}
            instances = current_instances(nvml, dev, profiles) if profiles else []
            out.append(
                {
                    "index": index,
                    "uuid": _text(nvml.nvmlDeviceGetUUID(dev)),
                    "name": _text(nvml.nvmlDeviceGetName(dev)),
                    "memory_mb": nvml.nvmlDeviceGetMemoryInfo(dev).total / (1024 * 1024),
                    "mig_mode": mode,
                    "geometry": [i.profile for i in instances],
                    "instances": [
                        {
                            "id": i.id,
                            "profile": i.profile,
                            "placement": {"start": i.start, "size": i.size},
                            "compute_instances": list(i.compute),
                        }
                        for i in instances
                    ],
                    "profiles": [p.to_json() for p in _by_size(profiles)],
                }
            )
        return out
    finally:
        nvml.nvmlShutdown()
