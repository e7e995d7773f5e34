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

from .errors import InstancesInUse, MigError, MigModeOff, MigNotPermitted, ProcessesUnseen, UnitsBusy
from .planning import Instance, Plan, Profile, plan_geometry
from .reading import _code, ci_profiles, current_instances, handle, mig_mode, nvml_session, read_profiles, text

log = logging.getLogger("gpu_manager.mig")  # the name it logged under as one module


def _full_compute_instance(nvml: Any, gi: Any) -> None:
    """One compute instance over all of the GPU instance's slices: the unit is the whole slice."""
    ci_id, _slices, _n = max(ci_profiles(nvml, gi), key=lambda c: c[1])
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_id)


# NVML lists a MIG device's processes in two calls: ordinary CUDA processes, and MPS clients
# (which the first call does not list: it shows their MPS server at most)
PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses")


def _busy_processes(nvml: Any, dev: Any, gi_ids: set[int], index: int) -> list[str]:
    """MIG devices (UUIDs) of those GPU instances that still have processes, CUDA or MPS clients.

    A list NVML will not show (NVML_ERROR_NO_PERMISSION: another user's processes, a container)
    is not an idle device: ProcessesUnseen (a MigNotPermitted), as nothing can tell that destroying it is safe. The
    MPS list missing from an old driver or binding (NOT_SUPPORTED, FUNCTION_NOT_FOUND) is skipped;
    any other error counts the device busy, so it is waited for like a running process."""
    busy = []
    absent = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND}
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, slot)
            if nvml.nvmlDeviceGetGpuInstanceId(mig) not in gi_ids:
                continue
            uuid = text(nvml.nvmlDeviceGetUUID(mig))
        except nvml.NVMLError:  # an empty slot
            continue
        pids: list[int] = []
        for name in PROCESS_LISTS:
            lister = getattr(nvml, name, None)
            if lister is None:  # a binding without the MPS list
                continue
            try:
                pids += [int(p.pid) for p in lister(mig)]
            except nvml.NVMLError as exc:
                code = _code(exc)
                if code == nvml.NVML_ERROR_NO_PERMISSION:
                    raise ProcessesUnseen(
                        index, f"{name} on {uuid}: no permission to see its processes, so it may be in use"
                    ) from exc
                if name != PROCESS_LISTS[0] and code in absent:
                    continue
                busy.append(f"{uuid} (processes unreadable: {type(exc).__name__})")
                break
        else:
            if pids:
                busy.append(f"{uuid} (pids {','.join(map(str, sorted(set(pids))))})")
    return busy


def _require_mig(nvml: Any, dev: Any, index: int) -> None:
    mode = mig_mode(nvml, dev)
    if mode != "enabled":
        raise MigModeOff(index, "MIG mode is off" if mode == "disabled" else "not MIG-capable")


def check_geometry(nvml: Any, index: int, target: list[str]) -> Plan:
    """The plan for `target`, without changing anything (InvalidGeometry, MigModeOff, UnknownGPU;
    ProcessesUnseen when NVML will not show the processes of an instance the plan destroys, so
    the caller refuses before it drains anything for a change that would be refused after)."""
    with nvml_session(nvml):
        dev = handle(nvml, index)
        _require_mig(nvml, dev, index)
        profiles = read_profiles(nvml, dev)
        plan = plan_geometry(profiles, current_instances(nvml, dev, profiles), list(target), index)
        _busy_processes(nvml, dev, {i.id for i in plan.destroy}, index)  # busy now is fine: drained next
        return plan


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
        while doomed and (procs := _busy_processes(nvml, dev, doomed, index)):
            if time.monotonic() >= deadline:
                raise UnitsBusy(index, procs)
            time.sleep(0.1)
        step = "reading"
        destroyed: list[Instance] = []
        try:
            for inst in plan.destroy:  # compute instances first: NVML refuses a GPU instance that has some
                step = f"destroying {inst.profile} (GPU instance {inst.id})"
                for ci in inst.ci_handles:
                    nvml.nvmlComputeInstanceDestroy(ci)
                nvml.nvmlGpuInstanceDestroy(inst.handle)
                destroyed.append(inst)
                log.info("gpu %d: destroyed %s at slice %d", index, inst.profile, inst.start)
        except nvml.NVMLError as exc:
            code = _code(exc)
            if code not in (nvml.NVML_ERROR_IN_USE, nvml.NVML_ERROR_NO_PERMISSION):
                raise MigError(f"gpu {index}: {step} failed: {type(exc).__name__}: {exc}") from exc
            restored = _restore(nvml, dev, index, profiles, {i.id for i in plan.destroy}, destroyed)
            if code == nvml.NVML_ERROR_NO_PERMISSION:
                raise MigNotPermitted(index, f"{step}: NVML_ERROR_NO_PERMISSION{restored}") from exc
            raise InstancesInUse(
                index,
                f"{step} refused: NVML_ERROR_IN_USE with no process visible on it "
                f"(a monitor such as DCGM may hold a handle to it){restored}",
            ) from exc
        try:
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
            if _code(exc) == nvml.NVML_ERROR_NO_PERMISSION:
                raise MigNotPermitted(index, f"{step}: NVML_ERROR_NO_PERMISSION") from exc
            raise MigError(f"gpu {index}: {step} failed: {type(exc).__name__}: {exc}") from exc
        return [i.profile for i in current_instances(nvml, dev, profiles)]


def _restore(
    nvml: Any, dev: Any, index: int, profiles: dict[str, Profile], doomed: set[int], destroyed: list[Instance]
) -> str:
    """Undo a destroy that stopped half-way, so that no unit vanishes: a doomed GPU instance left
    without compute instance gets its full one back, and those already destroyed are created again
    at their placements (with new MIG UUIDs: the manager rediscovers its units after). Returns
    what it did, for the error's message; a failure here is logged and named, never raised."""
    done, failed = [], []
    try:
        for inst in current_instances(nvml, dev, profiles):
            if inst.id in doomed and not inst.compute:
                _full_compute_instance(nvml, inst.handle)
                done.append(f"{inst.profile}'s compute instance")
    except nvml.NVMLError as exc:
        failed.append(f"compute instances ({type(exc).__name__})")
    for inst in destroyed:
        try:
            placement = nvml.c_nvmlGpuInstancePlacement_t(inst.start, inst.size)
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profiles[inst.profile].id, ctypes.byref(placement))
            _full_compute_instance(nvml, gi)
            done.append(f"{inst.profile} at slice {inst.start}")
        except nvml.NVMLError as exc:
            failed.append(f"{inst.profile} at slice {inst.start} ({type(exc).__name__})")
    for what in done:
        log.info("gpu %d: restored %s", index, what)
    if failed:
        log.warning("gpu %d: could not restore %s", index, ", ".join(failed))
    out = f"; restored {', '.join(done)}" if done else ""
    return out + (f"; NOT restored: {', '.join(failed)}" if failed else "")
