"""NVML faked at the pynvml call boundary (there is no GPU here), for the GPU Manager's tests.

Two fakes, both raising pynvml's own `NVMLError`s with NVML's return codes:

- `FakeNVML`: a described, static machine — what discovery reads (whole GPUs, MIG devices).
- `MigNVML`: a stateful machine of MIG-capable GPUs (`FakeGPU.a100_40gb()`, `FakeGPU.h100_80gb()`)
  that really creates and destroys GPU instances and compute instances, as the driver does:
  profile info and possible placements per GPU-instance profile, profile *ids* (19 for 1g.5gb)
  distinct from the `NVML_GPU_INSTANCE_PROFILE_*` constants, handles that are ctypes pointers,
  array/count arguments passed by reference, overlapping or unknown placements refused
  (`NVML_ERROR_INSUFFICIENT_RESOURCES` / `NVML_ERROR_INVALID_ARGUMENT`), a GPU instance that
  still has compute instances (or a compute instance with processes) refused on destroy
  (`NVML_ERROR_IN_USE`), everything refused with `NVML_ERROR_NOT_SUPPORTED` while MIG mode is
  off. Mutating calls are logged in `MigNVML.log` so tests can check what changed and in which
  order; `nvmlDeviceSetMigMode` is logged and refused (the code under test must never call it).

Both answer memory as the driver does: `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)` with
`reserved` apart (v2's `used` includes it, as R525's reference says; v1's `total` includes it), and
NVML_ERROR_FUNCTION_NOT_FOUND for v2 where a GPU is described as an old driver's (`v2: False`,
`MigNVML(memory_v2=False)`). `MigNVML` also has the privilege and process behaviour the manager
depends on: with `privileged=False` (not root, no mig-config capability) every create and destroy
of a GPU or compute instance, and the parent GPU's memory in MIG mode, fail with
NVML_ERROR_NO_PERMISSION (a MIG device's own memory does not); `mig_privilege()` answers the
manager's privilege probe from the same flag. MPS clients are listed apart: only
`nvmlDeviceGetMPSComputeRunningProcesses` shows a compute instance's `mps_processes`, only
`nvmlDeviceGetComputeRunningProcesses` its `processes`; `can_list_processes=False` makes both
lists fail with NO_PERMISSION. A GPU instance marked `held` (a monitor such as DCGM holding a
handle) refuses its destroy with NVML_ERROR_IN_USE though no process is listed.
"""

from __future__ import annotations

import ctypes
import itertools
import uuid as uuidlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3
MIB = 1024**2


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNVML:
    """The pynvml functions discovery calls, over a described machine; errors are pynvml's own."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    nvmlMemory_v2 = pynvml.nvmlMemory_v2  # noqa: N815

    def __init__(self, gpus, driver=True):
        self.gpus, self.driver, self.calls = gpus, driver, []

    def nvmlInit(self):  # noqa: N802
        if not self.driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.calls.append("init")

    def nvmlShutdown(self):  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return h["uuid"]

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return h["name"].encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h, version=None):  # noqa: N802
        """h: "mem" (total bytes), "used", "reserved" (bytes, 0), "v2" (False: an old driver's)."""
        reserved = h.get("reserved", 0)
        used = h.get("used", 0) + reserved  # both versions count the reserved part as used
        if not version:
            return SimpleNamespace(total=h["mem"], free=h["mem"] - used, used=used)
        if h.get("v2") is False:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(version=version, total=h["mem"], reserved=reserved, free=h["mem"] - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        if "util" not in h:  # a MIG device: NVML has no utilization figure for it
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        if "mig" not in h:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = self.NVML_DEVICE_MIG_ENABLE if h["mig"] is not None else self.NVML_DEVICE_MIG_DISABLE
        return (mode, mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):  # noqa: N802
        slots = h["mig"]
        if i >= len(slots) or slots[i] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return slots[i]


# -- the stateful MIG machine ---------------------------------------------------------------


@dataclass(frozen=True)
class GIProfileSpec:
    """One row of a GPU's GPU-instance profile table (`nvidia-smi mig -lgip` / `-lgipp`)."""

    constant: str  # the NVML_GPU_INSTANCE_PROFILE_* it answers to
    id: int  # the profile id nvmlDeviceCreateGpuInstance* take
    name: str  # as the v2 info reports it, "MIG 1g.5gb"
    slices: int  # compute slices (sliceCount)
    memory_mb: int
    count: int  # instanceCount: most instances of this profile at once
    starts: tuple[int, ...]  # possible placements' starts, in memory slices
    size: int  # and their size
    sms: int


def _a100_40gb() -> tuple[GIProfileSpec, ...]:
    p = "NVML_GPU_INSTANCE_PROFILE_"
    return (
        GIProfileSpec(p + "1_SLICE", 19, "MIG 1g.5gb", 1, 4864, 7, (0, 1, 2, 3, 4, 5, 6), 1, 14),
        GIProfileSpec(p + "1_SLICE_REV1", 20, "MIG 1g.5gb+me", 1, 4864, 1, (0, 1, 2, 3, 4, 5, 6), 1, 14),
        GIProfileSpec(p + "1_SLICE_REV2", 15, "MIG 1g.10gb", 1, 9856, 4, (0, 2, 4, 6), 2, 14),
        GIProfileSpec(p + "2_SLICE", 14, "MIG 2g.10gb", 2, 9856, 3, (0, 2, 4), 2, 28),
        GIProfileSpec(p + "3_SLICE", 9, "MIG 3g.20gb", 3, 20096, 2, (0, 4), 4, 42),
        GIProfileSpec(p + "4_SLICE", 5, "MIG 4g.20gb", 4, 20096, 1, (0,), 4, 56),
        GIProfileSpec(p + "7_SLICE", 0, "MIG 7g.40gb", 7, 40320, 1, (0,), 8, 98),
    )


def _h100_80gb() -> tuple[GIProfileSpec, ...]:
    p = "NVML_GPU_INSTANCE_PROFILE_"
    return (
        GIProfileSpec(p + "1_SLICE", 19, "MIG 1g.10gb", 1, 9984, 7, (0, 1, 2, 3, 4, 5, 6), 1, 16),
        GIProfileSpec(p + "1_SLICE_REV1", 20, "MIG 1g.10gb+me", 1, 9984, 1, (0, 1, 2, 3, 4, 5, 6), 1, 16),
        GIProfileSpec(p + "1_SLICE_REV2", 15, "MIG 1g.20gb", 1, 20096, 4, (0, 2, 4, 6), 2, 26),
        GIProfileSpec(p + "2_SLICE", 14, "MIG 2g.20gb", 2, 20096, 3, (0, 2, 4), 2, 32),
        GIProfileSpec(p + "3_SLICE", 9, "MIG 3g.40gb", 3, 40448, 2, (0, 4), 4, 60),
        GIProfileSpec(p + "4_SLICE", 5, "MIG 4g.40gb", 4, 40448, 1, (0,), 4, 64),
        GIProfileSpec(p + "7_SLICE", 0, "MIG 7g.80gb", 7, 81152, 1, (0,), 8, 132),
    )


_CI_CONSTANTS = {  # compute-instance profile constant -> its slices; the CI profile id is the constant
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


@dataclass
class FakeCI:
    id: int
    profile_id: int
    slices: int
    uuid: str
    handle: int
    processes: list[int] = field(default_factory=list)  # pids running on this MIG device
    mps_processes: list[int] = field(default_factory=list)  # MPS clients on it (listed apart)


@dataclass
class FakeGI:
    id: int
    spec: GIProfileSpec
    start: int
    handle: int
    cis: dict[int, FakeCI] = field(default_factory=dict)
    held: bool = False  # a monitor (DCGM) holds a handle: destroy answers IN_USE, no process listed


@dataclass
class FakeMigDevice:
    """What nvmlDeviceGetMigDeviceHandleByIndex answers: one compute instance seen as a device."""

    gpu: FakeGPU
    gi: FakeGI
    ci: FakeCI


class FakeGPU:
    def __init__(
        self,
        name: str,
        memory_mb: int,
        profiles: tuple[GIProfileSpec, ...] = (),
        *,
        mig: bool | None = True,
        uuid: str | None = None,
        reserved_mb: int = 0,
    ):
        """mig: True/False = MIG-capable with MIG mode on/off; None = not MIG-capable.
        reserved_mb: what the driver and firmware reserve of the whole GPU (v2's `reserved`)."""
        self.name, self.memory_mb, self.profiles = name, memory_mb, profiles
        self.reserved_mb = reserved_mb
        self.mig_capable = mig is not None
        self.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE if mig else pynvml.NVML_DEVICE_MIG_DISABLE
        self.uuid = uuid or f"GPU-{uuidlib.uuid4()}"
        self.gis: dict[int, FakeGI] = {}
        self.used_mb = 0  # what nvmlDeviceGetMemoryInfo says is used (the whole GPU's)
        self.utilization = 0  # percent, as nvmlDeviceGetUtilizationRates answers

    @classmethod
    def a100_40gb(cls, **kw) -> FakeGPU:
        return cls("NVIDIA A100-SXM4-40GB", 40960, _a100_40gb(), **kw)

    @classmethod
    def h100_80gb(cls, **kw) -> FakeGPU:
        return cls("NVIDIA H100 80GB HBM3", 81559, _h100_80gb(), **kw)

    @property
    def mig_on(self) -> bool:
        return self.mig_capable and self.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE

    def spec(self, profile_id: int) -> GIProfileSpec:
        for s in self.profiles:
            if s.id == profile_id:
                return s
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def geometry(self) -> list[str]:
        """The current GPU instances' profile names, by placement (for assertions)."""
        return [gi.spec.name.removeprefix("MIG ") for gi in sorted(self.gis.values(), key=lambda g: g.start)]

    def layout(self) -> list[tuple[str, int, int]]:
        """(profile, start, compute instances) of each GPU instance, by placement."""
        return [
            (g.spec.name.removeprefix("MIG "), g.start, len(g.cis))
            for g in sorted(self.gis.values(), key=lambda g: g.start)
        ]

    def mig_devices(self) -> list[FakeMigDevice]:
        return [
            FakeMigDevice(self, gi, ci)
            for gi in sorted(self.gis.values(), key=lambda g: g.start)
            for ci in sorted(gi.cis.values(), key=lambda c: c.id)
        ]


def _uint_ref(ref: Any) -> ctypes.c_uint:
    """The c_uint behind a byref()/pointer() argument, as the C library would write through it."""
    obj = getattr(ref, "_obj", None)
    if obj is None and isinstance(ref, ctypes._Pointer):
        obj = ref.contents
    if not isinstance(obj, ctypes.c_uint):
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return obj


class MigNVML:
    """A pynvml stand-in over `FakeGPU`s. Constants and ctypes types are pynvml's own."""

    NVMLError = pynvml.NVMLError

    nvmlMemory_v2 = pynvml.nvmlMemory_v2  # noqa: N815

    def __init__(
        self,
        gpus: list[FakeGPU],
        driver: bool = True,
        *,
        privileged: bool = True,
        can_list_processes: bool = True,
        memory_v2: bool = True,
    ):
        """privileged: root or the mig-config capability; can_list_processes: NVML shows the
        processes on MIG devices; memory_v2: the driver has nvmlDeviceGetMemoryInfo_v2 (R510+)."""
        self.gpus, self.driver = gpus, driver
        self.privileged, self.can_list_processes, self.memory_v2 = privileged, can_list_processes, memory_v2
        self.log: list[tuple] = []  # mutating calls: ("create_gi", gpu, profile, start) ...
        self.inits = 0
        self._handles: dict[int, Any] = {}
        self._next_handle = itertools.count(0x1000)
        self._next_uuid = itertools.count(1)

    def __getattr__(self, name: str):
        if name.startswith(("NVML_", "c_nvml", "nvmlGpuInstanceProfileInfo", "nvmlComputeInstanceProfileInfo")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # -- handles: ctypes pointers whose address names the object -----------------------------
    def _new_handle(self, obj: Any) -> int:
        n = next(self._next_handle)
        self._handles[n] = obj
        return n

    def _ptr(self, ctype, n: int):
        return ctypes.cast(ctypes.c_void_p(n), ctype)

    def _resolve(self, handle: Any, kind: type):
        if not isinstance(handle, ctypes._Pointer):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        obj = self._handles.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if not isinstance(obj, kind):  # null, stale (destroyed) or of another kind
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _gpu_of_gi(self, gi: FakeGI) -> FakeGPU:
        for gpu in self.gpus:
            if gpu.gis.get(gi.id) is gi:
                return gpu
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _check(self) -> None:
        if self.inits <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _require_privilege(self) -> None:
        """Creating or destroying MIG instances needs root or the mig-config capability."""
        self._check()
        if not self.privileged:
            raise _err(pynvml.NVML_ERROR_NO_PERMISSION)

    def _process_list(self, h: Any, pids: list[int]) -> list[Any]:
        self._check()
        if not self.can_list_processes:
            raise _err(pynvml.NVML_ERROR_NO_PERMISSION)
        return [SimpleNamespace(pid=pid, usedGpuMemory=0) for pid in pids]

    def mig_privilege(self):
        """The manager's privilege probe, answered from `privileged` (the real one asks the OS)."""
        from gpu_manager.mig import MigPrivilege

        why = "fake NVML: privileged" if self.privileged else "fake NVML: not root, no mig-config capability"
        return MigPrivilege(self.privileged, why)

    def _mig_gpu(self, device: Any) -> FakeGPU:
        self._check()
        if not isinstance(device, FakeGPU):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not device.mig_on:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device

    # -- session and devices ------------------------------------------------------------------
    def nvmlInit(self):  # noqa: N802
        if not self.driver:
            raise _err(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self):  # noqa: N802
        self._check()
        self.inits -= 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        self._check()
        if not 0 <= i < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        self._check()
        return h.ci.uuid if isinstance(h, FakeMigDevice) else h.uuid

    def nvmlDeviceGetName(self, h):  # noqa: N802
        self._check()
        if isinstance(h, FakeMigDevice):
            return f"{h.gpu.name} {h.gi.spec.name}"
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h, version=None):  # noqa: N802
        self._check()
        mig_device = isinstance(h, FakeMigDevice)
        if not mig_device and h.mig_on and not self.privileged:  # "aggregate information, only if
            raise _err(pynvml.NVML_ERROR_NO_PERMISSION)  # the caller has appropriate privileges"
        mb = h.gi.spec.memory_mb if mig_device else h.memory_mb
        reserved = 0 if mig_device else h.reserved_mb
        used = (0 if mig_device else h.used_mb) + reserved  # both versions count the reserved part as used
        if not version:
            return SimpleNamespace(total=mb * MIB, free=(mb - used) * MIB, used=used * MIB)
        if not self.memory_v2:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = pynvml.c_nvmlMemory_v2_t()
        info.version, info.total, info.reserved = version, mb * MIB, reserved * MIB
        info.free, info.used = (mb - used) * MIB, used * MIB
        return info

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        self._check()
        if isinstance(h, FakeMigDevice):  # as the driver: no utilization figure for a MIG device
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h.utilization, memory=0)

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        self._check()
        if not h.mig_capable:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [h.mig_mode, h.mig_mode]

    def nvmlDeviceSetMigMode(self, h, mode):  # noqa: N802
        self.log.append(("set_mig_mode", h.uuid, mode))
        raise _err(pynvml.NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):  # noqa: N802
        self._check()
        return 7 if h.mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):  # noqa: N802
        devices = self._mig_gpu(h).mig_devices()
        if not 0 <= i < len(devices):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return devices[i]

    def nvmlDeviceGetGpuInstanceId(self, h):  # noqa: N802
        self._check()
        if not isinstance(h, FakeMigDevice):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.gi.id

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        self._check()
        pids = h.ci.processes if isinstance(h, FakeMigDevice) else []
        return self._process_list(h, pids)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):  # noqa: N802
        """MPS clients only: `nvmlDeviceGetComputeRunningProcesses` does not list them."""
        return self._process_list(h, h.ci.mps_processes if isinstance(h, FakeMigDevice) else [])

    # -- GPU-instance profiles ----------------------------------------------------------------
    def _spec_for_constant(self, gpu: FakeGPU, profile: int) -> GIProfileSpec:
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for s in gpu.profiles:
            if getattr(pynvml, s.constant) == profile:
                return s
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile, version=2):  # noqa: N802
        spec = self._spec_for_constant(self._mig_gpu(device), profile)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id, info.isP2pSupported, info.sliceCount = spec.id, 0, spec.slices
        info.instanceCount, info.multiprocessorCount, info.memorySizeMB = spec.count, spec.sms, spec.memory_mb
        if version == 2:
            info.name = spec.name.encode()
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo  # noqa: N815

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device, profileId, placementsRef, countRef):  # noqa: N802, N803
        spec = self._mig_gpu(device).spec(profileId)
        count = _uint_ref(countRef)
        if placementsRef is None:  # NULL: how many there are
            count.value = len(spec.starts)
            return pynvml.NVML_SUCCESS
        if (
            not isinstance(placementsRef, ctypes.Array)
            or placementsRef._type_ is not pynvml.c_nvmlGpuInstancePlacement_t
        ):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if len(placementsRef) < len(spec.starts):
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(spec.starts):
            placementsRef[i].start, placementsRef[i].size = start, spec.size
        count.value = len(spec.starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device, profileId):  # noqa: N802, N803
        gpu = self._mig_gpu(device)
        spec = gpu.spec(profileId)
        return sum(1 for s in spec.starts if self._fits(gpu, spec, s)) if self._room(gpu, spec) else 0

    # -- GPU instances ------------------------------------------------------------------------
    @staticmethod
    def _room(gpu: FakeGPU, spec: GIProfileSpec) -> bool:
        return sum(1 for g in gpu.gis.values() if g.spec.id == spec.id) < spec.count

    @staticmethod
    def _fits(gpu: FakeGPU, spec: GIProfileSpec, start: int) -> bool:
        mine = set(range(start, start + spec.size))
        return all(not mine & set(range(g.start, g.start + g.spec.size)) for g in gpu.gis.values())

    def _create_gi(self, gpu: FakeGPU, spec: GIProfileSpec, start: int):
        gi_id = next(i for i in itertools.count(1) if i not in gpu.gis)
        gi = FakeGI(gi_id, spec, start, 0)
        gi.handle = self._new_handle(gi)
        gpu.gis[gi_id] = gi
        self.log.append(("create_gi", gpu.uuid, spec.name.removeprefix("MIG "), start))
        return self._ptr(pynvml.c_nvmlGpuInstance_t, gi.handle)

    def nvmlDeviceCreateGpuInstance(self, device, profileId):  # noqa: N802, N803
        gpu = self._mig_gpu(device)
        self._require_privilege()
        spec = gpu.spec(profileId)
        if not self._room(gpu, spec):
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        for start in reversed(spec.starts):  # the driver's own choice; fragments like the real one can
            if self._fits(gpu, spec, start):
                return self._create_gi(gpu, spec, start)
        raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device, profileId, placement):  # noqa: N802, N803
        gpu = self._mig_gpu(device)
        self._require_privilege()
        spec = gpu.spec(profileId)
        p = getattr(placement, "_obj", None)  # a `const nvmlGpuInstancePlacement_t *`: byref() it
        if p is None and isinstance(placement, ctypes._Pointer):
            p = placement.contents
        if not isinstance(p, pynvml.c_nvmlGpuInstancePlacement_t):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if p.start not in spec.starts or p.size != spec.size:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not self._room(gpu, spec) or not self._fits(gpu, spec, p.start):
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._create_gi(gpu, spec, p.start)

    def nvmlDeviceGetGpuInstances(self, device, profileId, gpuInstancesRef, countRef):  # noqa: N802, N803
        gpu = self._mig_gpu(device)
        spec = gpu.spec(profileId)
        count = _uint_ref(countRef)
        if not isinstance(gpuInstancesRef, ctypes.Array) or gpuInstancesRef._type_ is not pynvml.c_nvmlGpuInstance_t:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if len(gpuInstancesRef) < spec.count:  # "large enough for the instances the profile supports"
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        mine = sorted((g for g in gpu.gis.values() if g.spec.id == spec.id), key=lambda g: g.id)
        for i, gi in enumerate(mine):
            gpuInstancesRef[i] = self._ptr(pynvml.c_nvmlGpuInstance_t, gi.handle)
        count.value = len(mine)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpuInstance):  # noqa: N802, N803
        self._check()
        gi = self._resolve(gpuInstance, FakeGI)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gi.id, gi.spec.id
        info.placement.start, info.placement.size = gi.start, gi.spec.size
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance):  # noqa: N802, N803
        self._check()
        gi = self._resolve(gpuInstance, FakeGI)
        gpu = self._gpu_of_gi(gi)
        self._require_privilege()
        if gi.cis or gi.held:  # "processes or compute instances are active on the GPU instance"
            raise _err(pynvml.NVML_ERROR_IN_USE)
        del gpu.gis[gi.id], self._handles[gi.handle]
        self.log.append(("destroy_gi", gpu.uuid, gi.spec.name.removeprefix("MIG "), gi.start))
        return pynvml.NVML_SUCCESS

    # -- compute instances --------------------------------------------------------------------
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpuInstance, profile, engProfile, version=2):  # noqa: N802, N803
        self._check()
        gi = self._resolve(gpuInstance, FakeGI)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = _CI_CONSTANTS.get(profile)
        if slices is None or slices > gi.spec.slices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = (
            pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else pynvml.c_nvmlComputeInstanceProfileInfo_t()
        )
        info.id, info.sliceCount, info.instanceCount = profile, slices, gi.spec.slices // slices
        info.multiprocessorCount = gi.spec.sms * slices // gi.spec.slices
        if version == 2:
            info.name = f"MIG {slices}c.{gi.spec.name.removeprefix('MIG ')}".encode()
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo  # noqa: N815

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance, profileId):  # noqa: N802, N803
        self._check()
        gi = self._resolve(gpuInstance, FakeGI)
        gpu = self._gpu_of_gi(gi)
        self._require_privilege()
        slices = _CI_CONSTANTS.get(profileId)
        if slices is None or slices > gi.spec.slices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if sum(c.slices for c in gi.cis.values()) + slices > gi.spec.slices:
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in itertools.count(0) if i not in gi.cis)
        ci = FakeCI(
            ci_id,
            profileId,
            slices,
            f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{gpu.uuid}/{next(self._next_uuid)}')}",
            0,
        )
        ci.handle = self._new_handle(ci)
        gi.cis[ci_id] = ci
        self.log.append(("create_ci", gpu.uuid, gi.spec.name.removeprefix("MIG "), gi.start, slices))
        return self._ptr(pynvml.c_nvmlComputeInstance_t, ci.handle)

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance, profileId, computeInstancesRef, countRef):  # noqa: N802, N803
        self._check()
        gi = self._resolve(gpuInstance, FakeGI)
        slices = _CI_CONSTANTS.get(profileId)
        if slices is None or slices > gi.spec.slices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        count = _uint_ref(countRef)
        if (
            not isinstance(computeInstancesRef, ctypes.Array)
            or computeInstancesRef._type_ is not pynvml.c_nvmlComputeInstance_t
        ):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        mine = sorted((c for c in gi.cis.values() if c.profile_id == profileId), key=lambda c: c.id)
        if len(computeInstancesRef) < gi.spec.slices // slices:
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, ci in enumerate(mine):
            computeInstancesRef[i] = self._ptr(pynvml.c_nvmlComputeInstance_t, ci.handle)
        count.value = len(mine)
        return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, computeInstance):  # noqa: N802, N803
        self._check()
        ci = self._resolve(computeInstance, FakeCI)
        self._require_privilege()
        for gpu in self.gpus:
            for gi in gpu.gis.values():
                if gi.cis.get(ci.id) is ci:
                    if ci.processes or ci.mps_processes:
                        raise _err(pynvml.NVML_ERROR_IN_USE)
                    del gi.cis[ci.id], self._handles[ci.handle]
                    self.log.append(("destroy_ci", gpu.uuid, gi.spec.name.removeprefix("MIG "), gi.start))
                    return pynvml.NVML_SUCCESS
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # -- test set-up helpers (what an operator or another process did before) ------------------
    def preset(self, gpu: FakeGPU, layout: list[tuple[str, int]], *, compute: bool = True) -> None:
        """Create GPU instances (profile name, start) directly, each with one full compute instance
        (as root did before: whatever `privileged` says)."""
        self.nvmlInit()
        privileged, self.privileged = self.privileged, True
        try:
            for name, start in layout:
                spec = next(s for s in gpu.profiles if s.name == f"MIG {name}")
                p = pynvml.c_nvmlGpuInstancePlacement_t(start, spec.size)
                gi = self.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, spec.id, ctypes.byref(p))
                if compute:
                    full = max(c for c, s in _CI_CONSTANTS.items() if s == spec.slices)
                    self.nvmlGpuInstanceCreateComputeInstance(gi, full)
        finally:
            self.privileged = privileged
            self.nvmlShutdown()
        self.log.clear()


# -- per-process memory (the accounting's tests) ----------------------------------------------


class ProcessMemoryNVML(FakeNVML):
    """`FakeNVML` whose devices (whole GPUs, MIG devices) run processes, each with its used memory,
    listed as pynvml lists them: `nvmlDeviceGetComputeRunningProcesses` and
    `nvmlDeviceGetMPSComputeRunningProcesses` return objects with `pid`, `usedGpuMemory` (bytes;
    None where the driver reports NVML_VALUE_NOT_AVAILABLE), `gpuInstanceId`, `computeInstanceId`.
    With `mps=True` clients of an MPS server are listed by the MPS call only, as the driver does.
    `nvmlDeviceGetMemoryInfo` counts the processes' memory as used."""

    def __init__(self, gpus, driver=True, *, mps: bool = False):
        super().__init__(gpus, driver)
        self.mps = mps
        self.processes: dict[str, dict[int, int | None]] = {}  # device uuid -> pid -> used bytes

    def run_process(self, uuid: str, pid: int, used_mb: float | None) -> None:
        """A process on the device now uses `used_mb` (None: NVML does not report its figure)."""
        self.processes.setdefault(uuid, {})[pid] = None if used_mb is None else int(used_mb * MIB)

    def end_process(self, uuid: str, pid: int) -> None:
        self.processes.get(uuid, {}).pop(pid, None)

    def used_mb(self, uuid: str) -> float:
        return sum(b or 0 for b in self.processes.get(uuid, {}).values()) / MIB

    def _listed(self, h, mps: bool) -> list[SimpleNamespace]:
        if mps != self.mps:
            return []
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, used in self.processes.get(h["uuid"], {}).items()
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return self._listed(h, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):  # noqa: N802
        return self._listed(h, mps=True)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        used = int(self.used_mb(h["uuid"]) * MIB) + h.get("used", 0)
        return SimpleNamespace(total=h["mem"], free=h["mem"] - used, used=used)
