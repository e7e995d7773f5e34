"""Reading a GPU through NVML: its MIG mode, its GPU-instance profile table (with the placements
NVML allows), the GPU and compute instances that exist now, and every GPU's description for the
manager's API. Nothing here changes the GPU.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..discovery import memory_info
from .errors import UnknownGPU
from .planning import Instance, Profile, by_size

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


@contextmanager
def nvml_session(nvml: Any) -> Iterator[Any]:
    """nvmlInit … nvmlShutdown (NVML counts them, so sessions nest)."""
    nvml.nvmlInit()
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def text(value: Any) -> str:
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
    raw = text(getattr(info, "name", b"")).strip()
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


def ci_profiles(nvml: Any, gi: Any) -> list[tuple[int, int, int]]:
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
    for ci_id, slices, max_count in ci_profiles(nvml, gi):
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


def _memory_mb(nvml: Any, dev: Any) -> float | None:
    """The GPU's usable memory (NVML v2: total - reserved), or None where NVML will not say: in MIG
    mode the parent GPU's figure is privileged (NVML_ERROR_NO_PERMISSION for a non-root manager;
    its MIG devices' own figures, in its units, are not)."""
    try:
        return memory_info(nvml, dev).total / (1024 * 1024)
    except nvml.NVMLError as exc:
        if _code(exc) != nvml.NVML_ERROR_NO_PERMISSION:
            raise
        return None


def describe_gpus(nvml: Any) -> list[dict]:
    """Every GPU: MIG mode, current geometry and instances, supported profiles ([] without a driver).
    `memory_mb` is None where NVML refuses the figure to this process (see `_memory_mb`)."""
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
                    "uuid": text(nvml.nvmlDeviceGetUUID(dev)),
                    "name": text(nvml.nvmlDeviceGetName(dev)),
                    "memory_mb": _memory_mb(nvml, dev),
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
                    "profiles": [p.to_json() for p in by_size(profiles)],
                }
            )
        return out
    finally:
        nvml.nvmlShutdown()
