"""Memory accounting: what a model is charged on a unit, and how many workers a unit takes.

A model is charged its artifact plus the stated per-process overhead (a CUDA context) until its
worker was measured; from then on its measured cost on that kind of unit (the largest seen, peak
activations included), which the scheduler learns from the status (`measured_mb`). A cost grown
past what was reserved evicts the unit's least recently used other models.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from faas_gpu.models import Artifact

from .discovery import UnitInfo
from .memory import CUDA_CONTEXT_MB, device_kind, nvml_process_mb, overhead_mb, pid_of, unit_handle
from .worker import Worker

if TYPE_CHECKING:
    from .jobs import _UnitState

log = logging.getLogger("gpu_manager.manager")  # the name it logged under as one module
MPS_MAX_CLIENTS = 48  # client processes per MPS server (CUDA's MPS guide, Volta and later)
GPU_SLICES = 7  # compute slices of a whole A100/H100: a MIG slice's share of the clients


def mps_client_cap(info: UnitInfo) -> int:
    """Most MPS clients (workers) a unit's server takes: 48 on a whole GPU, scaled by a MIG
    compute instance's share of the GPU's slices (6 on a 1g slice, 20 on a 3g one)."""
    profile = info.profile
    if info.kind != "mig" or not profile:
        return MPS_MAX_CLIENTS
    head = profile.split("g.", 1)[0]
    slices = int(head) if head.isdigit() else 1
    return max(1, MPS_MAX_CLIENTS * min(slices, GPU_SLICES) // GPU_SLICES)


class MemoryAccounting:
    """The `GPUManager`'s memory accounting (a mixin: its state is the manager's, declared below).
    A cost grown past its reservation evicts through the job path's `_drop` and `_prepare` (`jobs.py`)."""

    costs: dict[tuple[str, str], float]  # measured cost (MB) per (model digest, device kind)
    _accounted: dict[tuple[str, str], float]  # per worker: the peak last charged
    charge_measured_cpu: bool
    max_workers_per_unit: int | None
    mps: Any
    nvml: Any
    _evictions: Any

    @staticmethod
    def model_mb(artifact: Artifact) -> float:
        """The artifact's size: a model's weights, not what its worker takes (`cost_mb` is)."""
        return artifact.size / (1024 * 1024)

    def charges_measured(self, info: UnitInfo) -> bool:
        return info.kind != "cpu" or self.charge_measured_cpu

    def cost_mb(self, artifact: Artifact, info: UnitInfo) -> float:
        """What a model is charged on a unit: its measured cost on that kind of unit where known,
        before that its artifact plus the stated per-process overhead (a CUDA context)."""
        if not self.charges_measured(info):
            return self.model_mb(artifact)
        known = self.costs.get((artifact.digest, device_kind(info.kind, info.gpu_name)))
        return known if known is not None else self.model_mb(artifact) + overhead_mb(info.kind)

    def worker_cap(self, info: UnitInfo) -> int | None:
        """Most workers on a unit: the configured cap, and with MPS the server's client limit."""
        caps = [self.max_workers_per_unit] if self.max_workers_per_unit is not None else []
        if self.mps is not None and info.kind != "cpu":
            caps.append(mps_client_cap(info))
        return min(caps) if caps else None

    # -- memory accounting ----------------------------------------------------------------------
    def _account(self, state: _UnitState, digest: str, worker: Worker) -> None:
        """Keep the worker's measured cost for (model, device kind), and charge it to the unit's
        cache where the unit charges measured costs: a cost grown past what was reserved evicts
        the least recently used other models (their workers stopped)."""
        key = (digest, state.info.id)
        measured = self._measure(state, worker)
        if measured is None:
            return
        self._accounted[key] = getattr(worker, "peak_mb", 0.0)
        kind = device_kind(state.info.kind, state.info.gpu_name)
        self.costs[(digest, kind)] = max(measured, self.costs.get((digest, kind), 0.0))
        if not self.charges_measured(state.info) or digest not in state.cache:
            return
        for victim in state.cache.resize(digest, self.costs[(digest, kind)]):
            log.info("unit %s: %s grew to %.0f MB; evicting %s", state.info.id, digest[:12], measured, victim[:12])
            self._drop((victim, state.info.id), state)
            self._evictions.labels(state.info.id).inc()
            self._prepare(state, victim)

    def _measure(self, state: _UnitState, worker: Worker) -> float | None:
        """The worker's cost in MB: cpu, its memory growth since before the load, at its peak;
        cuda, its CUDA context (NVML's per-process figure now less torch's reserved memory now,
        else `CUDA_CONTEXT_MB`) plus torch's peak reserved memory. Read after the load and after
        the first batch (lazy module loading and cuBLAS grow the context then), and whenever the
        peak grew. None for workers without a process (the sim back end)."""
        info, pid = getattr(worker, "info", None), pid_of(worker)
        if info is None or pid is None:
            return None
        peak = max(getattr(worker, "peak_mb", 0.0), info.memory_mb)
        if state.info.kind == "cpu":
            return peak + overhead_mb("cpu")
        used = self._nvml_used_mb(state.info, pid)
        now = getattr(worker, "now_mb", info.memory_mb)
        context = CUDA_CONTEXT_MB if used is None else max(0.0, used - now)
        return context + peak

    def _nvml_used_mb(self, info: UnitInfo, pid: int) -> float | None:
        """NVML's used memory of the worker's process on its unit; None where NVML does not say."""
        if self.nvml is None:
            return None
        try:
            self.nvml.nvmlInit()
        except Exception as exc:
            log.warning("memory: NVML unavailable (%s); charging the stated context", exc)
            return None
        try:
            return nvml_process_mb(self.nvml, unit_handle(self.nvml, info.index, info.id), pid)
        except Exception as exc:  # a unit NVML no longer shows: the stated context
            log.warning("memory: NVML per-process reading on %s failed (%s)", info.id, exc)
            return None
        finally:
            self.nvml.nvmlShutdown()
