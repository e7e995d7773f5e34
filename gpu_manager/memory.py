"""What a model costs on a unit, measured rather than guessed from its artifact's size.

A model's worker is a process of its own on its unit, so its cost is the whole process's share of
the unit's memory: on a GPU the worker's CUDA context (several hundred MiB per process on an
H100, more with cuBLAS/cuDNN workspaces), the weights, and the peak activation memory at the
batch sizes it serves. Two sources, read where they can be:

- NVML's per-process figure (`nvmlDeviceGetComputeRunningProcesses` /
  `nvmlDeviceGetMPSComputeRunningProcesses`: `usedGpuMemory` of the worker's pid), read by the
  manager after the load and after batches. It includes the context and everything torch's
  caching allocator holds. It can be missing: MPS clients under some drivers, a pid namespace
  (NVML names host pids), `usedGpuMemory` None where the driver does not report it.
- torch's own figures, sent by the worker: `torch.cuda.memory_reserved` /
  `max_memory_reserved` (what the allocator holds from the driver, at its peak) and
  `max_memory_allocated` (what tensors needed). They exclude the context, so without NVML the
  context is the stated `CUDA_CONTEXT_MB`.

On the `cpu` back end the unit is an emulated GPU budget, and the worker's interpreter and torch
(~145 MB of host memory, `process_mb`) are not on that device: the model's cost there is the
growth of the worker's private memory (USS, from `/proc/self/smaps_rollup`) from before the load
to after it, and its peak (the high-water RSS growth) after batches.

Sources: a CUDA context is ~300-400 MiB with CUDA >= 11.7's lazy module loading
(pytorch/pytorch#107667, #109888), 200-700 MiB by GPU in users' reports (#20532, #28113), ~700 MiB
on H100s (issue 19); docs/GPU-MEMORY.md has the figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
CUDA_CONTEXT_MB = 600.0  # stated per-process overhead of a cuda worker until NVML has measured it
CPU_PROCESS_MB = 0.0  # charged to an emulated cpu unit per worker (the interpreter is host memory)


@dataclass(frozen=True)
class MemoryReading:
    """One reading inside a worker: what it holds now and at its peak since it started (MB)."""

    now_mb: float
    peak_mb: float
    allocated_peak_mb: float = 0.0  # torch.cuda.max_memory_allocated, 0 on the cpu back end


def overhead_mb(device_kind: str) -> float:
    """The per-process overhead charged before a model's first measurement on this kind of unit."""
    return CPU_PROCESS_MB if device_kind == "cpu" else CUDA_CONTEXT_MB


def device_kind(kind: str, gpu_name: str | None) -> str:
    """What a measured figure is kept by, with the model: "cpu", or the GPU's name and whether it
    is a MIG slice (contexts differ by GPU model; a slice's is smaller than a whole GPU's)."""
    if kind == "cpu":
        return "cpu"
    return f"{kind}:{gpu_name or 'gpu'}"


# -- inside a worker -------------------------------------------------------------------------
def _proc_kb(path: str, fields: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in fields:
                    out[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def process_uss_mb(pid: int | str = "self") -> float:
    """A process's private memory (USS: Private_Clean + Private_Dirty), RSS where smaps is absent."""
    got = _proc_kb(f"/proc/{pid}/smaps_rollup", ("Private_Clean", "Private_Dirty"))
    if got:
        return sum(got.values()) / 1024
    return _proc_kb(f"/proc/{pid}/status", ("VmRSS",)).get("VmRSS", 0) / 1024


def process_rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(RSS now, its high-water mark VmHWM) of a process, in MB."""
    got = _proc_kb(f"/proc/{pid}/status", ("VmRSS", "VmHWM"))
    return got.get("VmRSS", 0) / 1024, got.get("VmHWM", 0) / 1024


def read_cuda(torch: Any) -> MemoryReading:
    """torch's caching allocator on this process's device: reserved now, reserved and allocated at peak."""
    return MemoryReading(
        torch.cuda.memory_reserved() / MIB,
        torch.cuda.max_memory_reserved() / MIB,
        torch.cuda.max_memory_allocated() / MIB,
    )


class WorkerMeter:
    """A worker's measurement of its model's cost: a baseline taken before the load, readings after.

    cpu: the cost is USS growth over the baseline (after the load), then the peak's growth
    (VmHWM over the baseline's RSS) once batches ran. cuda: torch's reserved memory (now and at its
    peak); the manager adds the context from NVML's per-process figure or `CUDA_CONTEXT_MB`."""

    USS_EVERY_S = 1.0
    """How stale the cpu figure *now* may be. USS comes from /proc/self/smaps_rollup, for which the
    kernel walks every mapping of the process: ~3 ms of CPU in a torch worker, more than the
    model's own batch (issue 20 found it as ~10 ms of path a batch)."""
    PEAK_EVERY_S = 0.25
    """How late the cpu peak may be told. The peak is the kernel's high-water mark (VmHWM, from
    /proc/self/status: ~30 µs, 3% of a worker's CPU at batch 8 when read every batch), so a later
    read still holds every growth before it; a batch larger than any before is read at once, as
    its activations are the likely growth."""

    def __init__(self, device: str, torch: Any, clock: Any = time.monotonic):
        self.cuda = device.startswith("cuda")
        self.torch = torch
        self.clock = clock
        self.base_uss = 0.0 if self.cuda else process_uss_mb()
        self.base_rss = 0.0 if self.cuda else process_rss_mb()[0]
        self.process_mb = self.base_uss  # the interpreter and torch, before any model (cpu only)
        self._uss = 0.0
        self._uss_at = -float("inf")
        self._peak = 0.0
        self._peak_at = -float("inf")
        self._largest = 0  # the most elements a batch has had

    def cost_mb(self, elements: int = 0) -> tuple[float, float]:
        """(the model's cost now, its peak so far), in MB, without the cuda context; `elements`:
        the batch's input elements just run (0: none)."""
        if self.cuda:
            r = read_cuda(self.torch)
            return r.now_mb, r.peak_mb
        now = self.clock()
        if now - self._uss_at >= self.USS_EVERY_S:
            self._uss = process_uss_mb() - self.base_uss
            self._uss_at = now
        if elements > self._largest or now - self._peak_at >= self.PEAK_EVERY_S:
            self._peak = process_rss_mb()[1] - self.base_rss
            self._peak_at = now
            self._largest = max(self._largest, elements)
        uss = self._uss
        return max(0.0, uss), max(0.0, uss, self._peak)


# -- in the manager: NVML's per-process figure -----------------------------------------------
def nvml_process_mb(nvml: Any, handle: Any, pid: int) -> float | None:
    """NVML's used memory of `pid` on a device (compute and MPS client lists), None when NVML does
    not list it or does not report the figure (`usedGpuMemory` None: not available)."""
    lists = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses")
    for name in lists:
        fn = getattr(nvml, name, None)
        if fn is None:
            continue
        try:
            procs = fn(handle)
        except nvml.NVMLError:  # not supported here, or no permission: the other list, else unknown
            continue
        for p in procs or ():
            if int(getattr(p, "pid", -1)) == pid:
                used = getattr(p, "usedGpuMemory", None)
                return None if used is None else used / MIB
    return None


def unit_handle(nvml: Any, index: int, uuid: str) -> Any:
    """The NVML handle of a unit (a GPU, or a MIG device by its UUID) of GPU `index`."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    got = nvml.nvmlDeviceGetUUID(handle)
    if (got.decode() if isinstance(got, bytes) else got) == uuid:
        return handle
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:
            continue
        got = nvml.nvmlDeviceGetUUID(mig)
        if (got.decode() if isinstance(got, bytes) else got) == uuid:
            return mig
    raise LookupError(f"unit {uuid}: not found on GPU {index}")


def pid_of(worker: Any) -> int | None:
    """The worker's process id, where it has a process (the sim back end's workers have none)."""
    proc = getattr(worker, "proc", None)
    return getattr(proc, "pid", None) if proc is not None else None
