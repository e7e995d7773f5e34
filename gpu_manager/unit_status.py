"""What the GPU Manager tells: each unit's status for the datastore (the scheduler places on
it), the Prometheus readings of a scrape, and the GPUs with their MIG geometry.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from faas_gpu.contract import metrics as m

from . import mig
from .discovery import UnitInfo, UnitUsage, read_usage
from .executors import UnitExecutor
from .jobs import _UnitState
from .memory import device_kind, overhead_mb

log = logging.getLogger("gpu_manager.manager")  # the name it logged under as one module


class UnitStatus:
    """The `GPUManager`'s status and metrics (a mixin: its state is the manager's, declared
    below). It reads the accounting (`costs`, `charges_measured`, `worker_cap`) and the
    administration (`worker_env`, `_known_env`, `mig_privilege`)."""

    units: dict[str, _UnitState]
    executor: UnitExecutor
    nvml: Any
    mps: Any
    costs: dict[tuple[str, str], float]
    _exec_s: dict[str, float]  # per model, for the estimated finish time
    _busy_seen: dict[str, tuple[float, float]]  # unit -> (time, busy_s) at the last scrape
    _scraping: threading.Lock  # scrapes only: never taken on a job's path

    def status(self) -> list[dict]:
        """What the manager reports into the datastore for the scheduler."""
        now = time.monotonic()
        return [
            {
                "unit": s.info.id,
                "kind": s.info.kind,
                "name": s.info.name,
                "gpu": s.info.index,
                "profile": s.info.profile,  # MIG profile ("4g.20gb"), None for a whole GPU or a cpu unit
                "gpu_name": s.info.gpu_name,
                "memory_mb": s.info.memory_mb,
                "used_mb": s.cache.used_mb,
                # per cached model: what it is charged (measured where known) and what was measured
                "model_mb": s.cache.sizes,
                # per model measured on this kind of unit, where the unit charges it (the scheduler learns these)
                "measured_mb": {
                    d: c
                    for (d, k), c in list(self.costs.items())
                    if self.charges_measured(s.info) and k == device_kind(s.info.kind, s.info.gpu_name)
                },
                # charged per model before its first measurement, on top of its artifact
                "overhead_mb": overhead_mb(s.info.kind) if self.charges_measured(s.info) else 0.0,
                "max_models": self.worker_cap(s.info),
                "state": "draining" if s.draining else "busy" if s.busy_since is not None else "idle",
                "busy_for_s": (now - s.busy_since) if s.busy_since is not None else 0.0,
                "estimated_finish_s": self._finish_estimate(s, now),
                "models": s.cache.models,
                "running": s.running,  # the digest of the model running now (the operator's status page)
                "warm_workers": self._warm_workers(s.info),  # pooled processes ready for this unit's next miss
                # models held prepared in host memory for this unit's environment (no device memory: not in used_mb)
                "prepared": self._prepared_models(s.info),
                # models an idle process of this unit's environment holds parsed (weights bound at the miss)
                "parsed": self._parsed_models(s.info),
            }
            for s in self.units.values()
        ]

    def _warm_workers(self, info: UnitInfo) -> int:
        if self.mps is not None and info.kind != "cpu":
            return 0  # under MPS the unit's environment names its daemon: not asked for here (it may start it)
        return self.executor.warm(self.worker_env(info, ""))

    def _prepared_models(self, info: UnitInfo) -> list[str]:
        """The models a miss on this unit would find prepared (their environment is the unit's)."""
        return sorted(d for d, env in self.executor.prepared() if env == self._known_env(info, d))

    def _parsed_models(self, info: UnitInfo) -> list[str]:
        """The models a miss on this unit would find parsed."""
        if self.mps is not None and info.kind != "cpu":
            return []  # as `_warm_workers`: the environment is not asked for under MPS
        return self.executor.parsed(self.worker_env(info, ""))

    def _readings(self) -> dict[m.MetricSpec, list]:
        """The units as a scrape sees them: Triton's GPU figures (NVML's on GPUs, the emulated
        unit's own on the cpu and sim back ends and where NVML has none), the cache, the unit's kind."""
        states = list(self.units.values())
        usage: dict[str, UnitUsage] = {}
        if self.nvml is not None:
            try:
                usage = read_usage(self.nvml, [s.info for s in states])
            except Exception as exc:  # NVML away for a moment: the emulated figures this scrape
                log.warning("metrics: NVML reading failed (%s); using the units' own figures", exc)
        readings = (m.GPU_UTILIZATION, m.GPU_MEMORY_TOTAL, m.GPU_MEMORY_USED, m.UNIT_INFO, m.MODELS_CACHED)
        out: dict[m.MetricSpec, list] = {spec: [] for spec in readings}
        for s in states:
            uid = s.info.id
            read = usage.get(uid)
            total = read.total_bytes if read else s.info.memory_mb * 1024 * 1024
            used = read.used_bytes if read else s.cache.used_mb * 1024 * 1024
            utilization = read.utilization if read and read.utilization is not None else self._busy_share(s)
            out[m.GPU_UTILIZATION].append(((uid,), utilization))
            out[m.GPU_MEMORY_TOTAL].append(((uid,), total))
            out[m.GPU_MEMORY_USED].append(((uid,), used))
            out[m.UNIT_INFO].append(((uid, s.info.kind, s.info.index, s.info.profile or ""), 1))
            out[m.MODELS_CACHED].append(((uid,), len(s.cache.models)))
        return out

    def _busy_share(self, s: _UnitState) -> float:
        """The share of time the unit ran a job since the previous scrape (since its first job before that)."""
        now = time.monotonic()
        busy_since = s.busy_since
        busy = s.busy_s + (now - busy_since if busy_since is not None else 0.0)
        with self._scraping:
            seen_t, seen_busy = self._busy_seen.get(s.info.id, (None, 0.0))
            self._busy_seen[s.info.id] = (now, busy)
        if seen_t is None:
            return 1.0 if busy_since is not None else 0.0
        return min(1.0, max(0.0, (busy - seen_busy) / max(now - seen_t, 1e-9)))

    def _finish_estimate(self, s: _UnitState, now: float) -> float:
        """Seconds until the running job should end, from the model's recent execution times."""
        if s.busy_since is None or s.running is None:
            return 0.0
        return max(0.0, self._exec_s.get(s.running, 0.0) - (now - s.busy_since))

    def gpus(self) -> list[dict]:
        """Each GPU: MIG mode, geometry, instances, supported profiles, and this manager's units on it."""
        if self.nvml is None:
            return []
        out = mig.describe_gpus(self.nvml)
        for gpu in out:
            gpu["units"] = [
                s.info.id for s in self.units.values() if s.info.kind != "cpu" and s.info.index == gpu["index"]
            ]
            gpu["mps"] = self.mps is not None
            gpu.update(self.mig_privilege().to_json())
        return out
