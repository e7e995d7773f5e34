"""Applying a MIG geometry: validate it against the GPU's own table, refuse while units are busy,
then destroy compute instances and GPU instances and create the new ones at their planned
placements, each with one full-slice compute instance. MIG mode itself is never changed.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from typing import Any

from .errors import MigError, MigModeOff, UnitsBusy
from .planning import Plan, plan_geometry
from .reading import ci_profiles, current_instances, handle, mig_mode, nvml_session, read_profiles, text

log = logging.getLogger("gpu_manager.mig")  # the name it logged under as one module


def _full_compute_instance(nvml: Any, gi: Any) -> None:
    """One compute instance over all of the GPU instance's slices: the unit is the whole slice."""
    ci_id, _slices, _n = max(ci_profiles(nvml, gi), key=lambda c: c[1])
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
            busy.append(f"{text(nvml.nvmlDeviceGetUUID(mig))} (pids {pids})")
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
