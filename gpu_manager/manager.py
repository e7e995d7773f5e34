"""The GPU Manager's core: units, their model caches, and the workers that run jobs.

One job at a time per unit (the paper's rule). A job names a model (its artifact's digest) and
a unit; a model not cached on the unit is loaded first, evicting the unit's least recently used
models (the same `ModelCache` policy object the scheduler and the simulator use) and stopping
their workers, which frees their memory. A worker that dies mid-job is replaced and the job is
retried once; the manager itself never goes down with it.

With GPU control (the `cuda` back end: `nvml` given), a GPU's MIG geometry can be changed
(`reconfigure`, PROTEAN §4.4): its units are drained — taken out of placement, their running
jobs waited for, their workers and MPS daemons stopped — the geometry is applied through NVML
(`mig.apply_geometry`) and the GPU's units are discovered anew. With MPS on, each cuda unit has
its own MPS control daemon and its workers join it (`mps.MPSControl`).

`GPUManager` is the facade over modules of their own: the job path (`jobs.py`: the job API,
loads, evictions, the host-memory tier's orders) and its unit executor (`executors.py`: what runs
the loaded models, one worker process per model and unit today), the memory accounting
(`accounting.py`), MPS and MIG administration (`administration.py`), and status and metrics
(`unit_status.py`). Their state is the manager's own; the executor is an object it owns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from faas_gpu.contract import metrics as m
from faas_gpu.models import ModelStore
from faas_gpu.mps import thread_percentage
from faas_gpu.observability import DaemonMetrics
from faas_gpu.policies import ModelCache
from faas_gpu.sandbox.worker import Walls

from . import mig
from .accounting import GPU_SLICES, MPS_MAX_CLIENTS, MemoryAccounting, mps_client_cap
from .administration import Administration
from .discovery import UnitInfo
from .executors import ProcessExecutor, UnitExecutor
from .jobs import (
    BatchDoesNotFit,
    DeviceMemoryBusy,
    JobPath,
    JobResult,
    ModelDoesNotFit,
    NotResident,
    UnitDraining,
    UnknownModel,
    UnknownUnit,
    _UnitState,
    load_split,
)
from .mps import MPSControl
from .pool import WorkerPool
from .unit_status import UnitStatus
from .worker import Worker

__all__ = [  # the names importable from here, as when this module held them all
    "GPU_SLICES",
    "MPS_MAX_CLIENTS",
    "BatchDoesNotFit",
    "DeviceMemoryBusy",
    "GPUManager",
    "JobResult",
    "ModelDoesNotFit",
    "NotResident",
    "UnitDraining",
    "UnknownModel",
    "UnknownUnit",
    "load_split",
    "mps_client_cap",
]

log = logging.getLogger(__name__)


class GPUManager(JobPath, MemoryAccounting, Administration, UnitStatus):
    def __init__(
        self,
        units: list[UnitInfo],
        store: ModelStore,
        *,
        threads_per_worker: int = 1,
        worker_factory: Callable[..., Worker] | None = None,
        nvml: Any | None = None,
        mps: MPSControl | None = None,
        mps_thread_percentage: int | None = None,
        warm_workers: int = 0,
        mig_privilege: Callable[[], mig.MigPrivilege] | None = None,
        max_workers_per_unit: int | None = None,
        charge_measured_cpu: bool = False,
        prepared_mb: float = 0.0,
        parsed_programs: int = 8,
        optimize: bool = True,
        walls: Walls | None = None,
    ):
        """nvml: the NVML module (`pynvml`) for GPU control, None for back ends without GPUs.
        mps: MPS control daemons for the cuda units (None: no MPS).
        mig_privilege: whether this process may change MIG geometry (default `mig.probe_privilege`,
        asked of the OS; an NVML stand-in with its own `mig_privilege`, the tests' fake, answers it).
        worker_factory(artifact, device) builds a worker; for cuda units it is also given
        env= (CUDA_VISIBLE_DEVICES, and the MPS variables with MPS on) for the worker process.
        warm_workers: idle worker processes kept per unit environment for the default (torch)
        workers, so a miss skips the interpreter's start and torch's import (`pool.py`); 0: none.
        max_workers_per_unit: most workers (cached models) per unit; with MPS also at most the
        server's client limit (`mps_client_cap`). At the cap a load evicts the least recently used.
        charge_measured_cpu: charge cpu units the measured cost too (GPU units always are); off,
        an emulated cpu unit's budget is in artifact megabytes, as its operator sized it.
        prepared_mb: host memory for prepared workers (`pool.py`: a model read and checked ahead,
        so its miss costs only the copy to the device and the warm-up); 0: none. A model is
        prepared when it is uploaded (for the least loaded unit: `uploaded`) and again when the
        cache evicts it from a unit (for that unit). Prepared workers hold no device memory: they
        are charged to no unit, only to this budget.
        parsed_programs: torch.export programs each idle pooled process holds parsed, without
        weights (`pool.WorkerPool.remember`), per unit environment: those uploaded to the node for
        the unit (as `uploaded` picks it) and those loaded on it; 0: none.
        optimize: the workers rewrite models for inference where that is safe and checked
        (`optimize.py`, the cpu back end); False serves every model exactly as loaded.
        walls: what every worker process enters before it reads an artifact (`isolation.py`: an
        unprivileged uid, no network, nothing of the state folder); None: none (the daemon
        always decides, and says so)."""
        if not units and nvml is None:
            raise ValueError("units: the manager needs at least one unit")
        self.store = store
        self.threads = threads_per_worker
        self.optimize = optimize
        self.units = {u.id: self._state(u) for u in units}
        # the loaded models: real torch workers (cpu, cuda), or the sim back end's profiled workers
        self.executor: UnitExecutor = ProcessExecutor(
            self.threads,
            worker_factory,
            warm_workers=warm_workers,
            prepared_mb=prepared_mb,
            parsed_programs=parsed_programs,
            walls=walls,
        )
        self._exec_s: dict[str, float] = {}  # per model, for the estimated finish time
        self.nvml, self.mps = nvml, mps
        self.mps_thread_percentage = None if mps_thread_percentage is None else thread_percentage(mps_thread_percentage)
        self._model_pct: dict[str, int] = {}  # per model (digest): its MPS active thread percentage
        if max_workers_per_unit is not None and max_workers_per_unit < 1:
            raise ValueError(f"max_workers_per_unit: at least 1, got {max_workers_per_unit}")
        self.max_workers_per_unit, self.charge_measured_cpu = max_workers_per_unit, charge_measured_cpu
        # measured cost (MB) per (model digest, device kind): the largest seen, peak activations included
        self.costs: dict[tuple[str, str], float] = {}
        self._accounted: dict[tuple[str, str], float] = {}  # per worker: the peak last charged
        self._reconfiguring = threading.Lock()
        self._probe = mig_privilege or getattr(nvml, "mig_privilege", None) or mig.probe_privilege
        self._nvml_refused: str | None = None  # NVML's own NO_PERMISSION, once seen: the probe was wrong
        self.privilege = self._probe() if nvml is not None else mig.MigPrivilege(False, "no GPU control")
        if nvml is not None:
            log.info("MIG geometry control: %s (%s)", "yes" if self.privilege.allowed else "no", self.privilege.reason)
        self.on_units_changed: list[Callable[[], None]] = []  # e.g. the status reporter, at once
        self.metrics = DaemonMetrics(m.Daemon.GPU_MANAGER)
        self._hits = self.metrics.counter(m.MODEL_CACHE_HITS)
        self._misses = self.metrics.counter(m.MODEL_CACHE_MISSES)
        self._loads = self.metrics.counter(m.MODEL_LOADS)
        self._evictions = self.metrics.counter(m.MODEL_EVICTIONS)
        self._load_seconds = self.metrics.histogram(m.MODEL_LOAD_SECONDS)
        self._reconfigurations = self.metrics.counter(m.MIG_RECONFIGURATIONS)
        self._busy_seen: dict[str, tuple[float, float]] = {}  # unit -> (time, busy_s) at the last scrape
        self._scraping = threading.Lock()  # scrapes only: never taken on a job's path
        self.metrics.add_reader(self._readings)
        if mps is None:  # with MPS a unit's environment comes with its daemon: its pool fills at its first miss
            for env in {tuple(sorted(self.worker_env(s.info, "").items())) for s in self.units.values()}:
                self.executor.refill(dict(env))

    @staticmethod
    def _state(info: UnitInfo) -> _UnitState:
        return _UnitState(info, ModelCache(info.memory_mb), threading.Lock())

    # -- the per-model-process executor's parts, as they were named on the manager ---------------
    @property
    def workers(self) -> dict[tuple[str, str], Worker]:
        """The loaded models' workers, by (digest, unit)."""
        return self.executor.workers

    @property
    def pool(self) -> WorkerPool:
        """The warm, prepared and parsed worker processes (`pool.py`)."""
        return self._processes().pool

    @pool.setter
    def pool(self, pool: WorkerPool) -> None:
        self._processes().pool = pool

    @property
    def worker_factory(self) -> Callable[..., Worker]:
        """worker_factory(artifact, device[, env=]) -> a worker, not started."""
        return self._processes().worker_factory

    @worker_factory.setter
    def worker_factory(self, factory: Callable[..., Worker]) -> None:
        self._processes().worker_factory = factory

    def _processes(self) -> ProcessExecutor:
        if not isinstance(self.executor, ProcessExecutor):
            raise AttributeError("the unit executor runs no worker process per model")
        return self.executor

    def close(self) -> None:
        self.executor.close()
        if self.mps is not None:
            self.mps.stop_all()
