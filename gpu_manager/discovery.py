"""GPU unit discovery through NVML (nvidia-ml-py, `import pynvml`): read-only queries only.

A unit is what a job runs on: a whole GPU, or — when MIG is on — each MIG device, with its own
memory. Machines without the driver have no GPU units; the `cpu` back end then emulates units
with memory budgets. The NVML module is a parameter so that tests replace it at this boundary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass(frozen=True)
class UnitInfo:
    id: str  # the NVML UUID (GPU-… or MIG-…), or cpu-<n> for emulated units
    kind: str  # "gpu", "mig" or "cpu"
    name: str
    memory_mb: float
    index: int  # the GPU's index; MIG devices share their parent's
    parent: str | None = None  # the GPU's UUID, for a MIG device

    @property
    def profile(self) -> str | None:
        """A MIG device's profile ("4g.20gb"), from NVML's name "NVIDIA A100-SXM4-40GB MIG 4g.20gb"; None otherwise."""
        if self.kind != "mig":
            return None
        _, sep, profile = self.name.rpartition(" MIG ")
        return profile.strip() if sep else None

    @property
    def gpu_name(self) -> str | None:
        """The GPU model's name ("NVIDIA A100-SXM4-40GB"): a reconfiguration controller matches its MIG table on it."""
        if self.kind == "cpu":
            return None
        return self.name.rpartition(" MIG ")[0] if self.kind == "mig" and " MIG " in self.name else self.name


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


NVML_MEMORY_V2 = 0x02000028  # pynvml's nvmlMemory_v2: the struct's version, passed as `version=`


@dataclass(frozen=True)
class Memory:
    """A device's memory as a job can have it: `total` without what the driver and firmware reserve."""

    total: int  # bytes: NVML v2's total - reserved (v1's total where v2 is not there)
    used: int  # bytes allocated, the reserved part left out
    reserved: int  # bytes; 0 where only v1 answered
    version: int  # 2 or 1: which call answered


def memory_info(nvml: Any, handle: Any) -> Memory:
    """One memory figure for discovery, usage and the API: `nvmlDeviceGetMemoryInfo_v2`.

    v1's `total` includes memory the driver reserves (hundreds of MiB on an H100), so a unit sized
    by it promises more than a job can allocate. v2 reports `reserved` apart; usable = total -
    reserved. The docs disagree on whether v2's `used` includes `reserved` (R525 and cuda-python: it
    does; later NVML references say nothing), so it is read from the figures: free + used = total
    means it does, free + used + reserved = total that it does not.
    Falls back to v1 where v2 is unsupported (NVML_ERROR_FUNCTION_NOT_FOUND from a driver older
    than R510, NOT_SUPPORTED, or a binding without `version=`); any other error is raised, e.g.
    NVML_ERROR_NO_PERMISSION for a MIG-mode parent GPU's memory without privilege."""
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=getattr(nvml, "nvmlMemory_v2", NVML_MEMORY_V2))
    except TypeError:  # a binding without version=
        mem = None
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) not in (nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_NOT_SUPPORTED):
            raise
        mem = None
    if mem is None or not hasattr(mem, "reserved"):
        mem = mem or nvml.nvmlDeviceGetMemoryInfo(handle)
        return Memory(int(mem.total), int(mem.used), 0, 1)
    total, reserved, used, free = int(mem.total), int(mem.reserved), int(mem.used), int(mem.free)
    if abs(free + used - total) <= abs(free + used + reserved - total):  # used counts the reserved part
        used -= reserved
    return Memory(max(0, total - reserved), max(0, used), reserved, 2)


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # not MIG-capable (NVMLError_NotSupported) or no permission
        return False
    return current == nvml.NVML_DEVICE_MIG_ENABLE


def discover_units(nvml: ModuleType | Any | None = None) -> list[UnitInfo]:
    """Every GPU unit of this node; [] when there is no NVIDIA driver."""
    if nvml is None:
        import pynvml as nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.info("no NVIDIA GPUs here (%s)", exc)
        return []
    try:
        units: list[UnitInfo] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid, name = _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle))
            if not _mig_enabled(nvml, handle):
                mem = memory_info(nvml, handle).total / MIB
                units.append(UnitInfo(uuid, "gpu", name, mem, index))
                continue
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nvml.NVMLError:  # an empty slot (NVMLError_NotFound)
                    continue
                mem = memory_info(nvml, mig).total / MIB
                mig_uuid = _text(nvml.nvmlDeviceGetUUID(mig))
                units.append(UnitInfo(mig_uuid, "mig", _text(nvml.nvmlDeviceGetName(mig)), mem, index, uuid))
        return units
    finally:
        nvml.nvmlShutdown()


def gpu_count(nvml: ModuleType | Any | None = None) -> int:
    """How many NVIDIA GPUs NVML sees (0 without a driver), units or not (MIG on, no instance yet)."""
    if nvml is None:
        import pynvml as nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        nvml.nvmlShutdown()


def cpu_units(count: int, memory_mb: float) -> list[UnitInfo]:
    """Emulated units for the `cpu` back end: real torch on the CPU within a memory budget."""
    if count < 1 or memory_mb <= 0:
        raise ValueError(f"cpu units: need count >= 1 and memory_mb > 0, got {count} x {memory_mb}")
    return [UnitInfo(f"cpu-{i}", "cpu", "cpu", float(memory_mb), i) for i in range(count)]


@dataclass(frozen=True)
class UnitUsage:
    """NVML's figures for a unit: `total_bytes` is the usable memory (v2's total - reserved), as in discovery."""

    total_bytes: float
    used_bytes: float
    utilization: float | None  # 0.0-1.0; None where NVML has no figure (MIG devices)


def read_usage(nvml: ModuleType | Any, units: list[UnitInfo]) -> dict[str, UnitUsage]:
    """NVML's memory and utilization of each GPU or MIG unit, by unit id (read-only queries).

    Whole GPUs answer `nvmlDeviceGetUtilizationRates`; MIG devices do not (NVML_ERROR_NOT_SUPPORTED),
    so theirs is None and the caller uses its own figure. A unit NVML no longer shows is left out."""
    wanted = {u.id for u in units if u.kind != "cpu"}
    if not wanted:
        return {}
    nvml.nvmlInit()
    try:
        handles: dict[str, Any] = {}
        for index in sorted({u.index for u in units if u.kind != "cpu"}):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            if uuid in wanted:
                handles[uuid] = handle
            if not any(u.kind == "mig" and u.index == index for u in units):
                continue
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nvml.NVMLError:
                    continue
                mig_uuid = _text(nvml.nvmlDeviceGetUUID(mig))
                if mig_uuid in wanted:
                    handles[mig_uuid] = mig
        out: dict[str, UnitUsage] = {}
        for uuid, handle in handles.items():
            mem = memory_info(nvml, handle)
            try:
                utilization: float | None = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
            except nvml.NVMLError:
                utilization = None
            out[uuid] = UnitUsage(float(mem.total), float(mem.used), utilization)
        return out
    finally:
        nvml.nvmlShutdown()
