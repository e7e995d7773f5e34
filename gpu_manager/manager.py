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
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faas_gpu import tracing
from faas_gpu.contract import metrics as m
from faas_gpu.contract.errors import ModelNotUploaded
from faas_gpu.models import Artifact, ModelStore
from faas_gpu.mps import thread_percentage
from faas_gpu.observability import DaemonMetrics
from faas_gpu.policies import ModelCache, ModelTooLarge
from faas_gpu.walls import Walls

from . import mig, optimize
from .discovery import UnitInfo, UnitUsage, discover_units, read_usage
from .memory import CUDA_CONTEXT_MB, device_kind, nvml_process_mb, overhead_mb, pid_of, unit_handle
from .mps import MPSControl
from .pool import WorkerPool
from .worker import DeviceFault, OutOfDeviceMemory, Worker, WorkerDied, spawn_pooled

log = logging.getLogger(__name__)
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


class UnknownModel(ModelNotUploaded):
    """The job's model is not in this node's store: answered 404 with the code the scheduler
    acts on (it uploads the model, then sends the job again)."""


class UnknownUnit(LookupError):
    pass


class ModelDoesNotFit(ValueError):
    """A model larger than the unit (answered 507 with the sizes)."""


class NotResident(LookupError):
    """A leased job's model is not loaded on its unit (answered 409): a lease never loads a model,
    since a load evicts others behind the scheduler's back; the instance sends it to the scheduler."""


class UnitDraining(RuntimeError):
    """The unit is being drained for a reconfiguration, or is gone (answered 503: place it again)."""


class BatchDoesNotFit(ModelDoesNotFit):
    """The batch ran out of memory even with the model alone on its unit (507: a smaller batch may fit)."""


class DeviceMemoryBusy(RuntimeError):
    """Out of memory at load with the unit emptied, though the model was measured to fit it:
    memory someone else holds (a worker still exiting, another tenant). Answered 503: retry later."""


@dataclass
class JobResult:
    payload: bytes
    unit: str
    hit: bool
    load_s: float
    execute_s: float
    load_split: dict[str, float] | None = None  # on a miss: spawn / read / to_device / optimize / warmup seconds
    model_mb: float = 0.0  # what the model is charged on its unit now (measured where known)


@dataclass
class _UnitState:
    info: UnitInfo
    cache: ModelCache
    lock: threading.Lock
    busy_since: float | None = None
    running: str | None = None
    draining: bool = False  # no new jobs: a reconfiguration is waiting for this unit
    retired: bool = False  # the unit no longer exists (its GPU was sliced anew)
    busy_s: float = 0.0  # time spent running jobs, for the emulated utilization figure


def load_split(worker: Worker) -> dict[str, float] | None:
    """A loaded worker's split (None for back ends whose workers report none, like the sim's)."""
    info = getattr(worker, "info", None)
    if info is None or not hasattr(info, "read_s"):
        return None
    split = {"spawn": info.spawn_s, "read": info.read_s, "to_device": info.to_device_s}
    split.update(optimize=getattr(info, "optimize_s", 0.0), warmup=info.warmup_s)
    if getattr(info, "prepared", False):  # read ahead by a prepared worker: how long it took, how long before
        split.update(prepare=info.prepare_s, prepared_ahead=info.prepared_ahead_s)
    if getattr(info, "parsed", False):  # bound into a program a pooled process parsed ahead: the parse's time
        split.update(parse=info.parse_s)
    return split


class GPUManager:
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
        self.workers: dict[tuple[str, str], Worker] = {}
        # the back end: real torch workers (cpu, cuda), or the sim back end's profiled workers
        self.pool = WorkerPool(
            warm_workers if worker_factory is None else 0,
            self.threads,
            functools.partial(spawn_pooled, walls=walls),
            budget_mb=prepared_mb if worker_factory is None else 0.0,
            parse_max=parsed_programs,
        )
        self.worker_factory = worker_factory or (
            lambda artifact, device, env=None: Worker(
                artifact, device, self.threads, env=env, pool=self.pool, walls=walls
            )
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
                self.pool.refill(dict(env))

    @staticmethod
    def _state(info: UnitInfo) -> _UnitState:
        return _UnitState(info, ModelCache(info.memory_mb), threading.Lock())

    @staticmethod
    def _device(info: UnitInfo) -> str:
        # a cuda worker sees only its unit (CUDA_VISIBLE_DEVICES = the GPU's or MIG device's UUID)
        return "cpu" if info.kind == "cpu" else "cuda:0"

    def worker_env(self, info: UnitInfo, digest: str) -> dict[str, str]:
        """The environment of a model's worker on a unit: its device, its MPS daemon and share, and
        whether it may rewrite the model for inference (`optimize.ENV`)."""
        env = {} if self.optimize else {optimize.ENV: "0"}
        if info.kind == "cpu":
            return env
        if self.mps is None:
            return {**env, "CUDA_VISIBLE_DEVICES": info.id}
        pct = self._model_pct.get(digest, self.mps_thread_percentage)
        return {**env, **self.mps.ensure(info.id).client_env(pct)}

    def set_active_thread_percentage(self, digest: str, pct: int | None) -> None:
        """A model's MPS share of its unit's SMs (None: the default); its next worker gets it."""
        if pct is None:
            self._model_pct.pop(digest, None)
        else:
            self._model_pct[digest] = thread_percentage(pct)

    def start_mps(self) -> None:
        """Start the MPS daemon of every cuda unit now (else each starts with its first worker)."""
        if self.mps is not None:
            for s in list(self.units.values()):
                if s.info.kind != "cpu":
                    self.mps.ensure(s.info.id)

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

    def run(
        self, digest: str, unit_id: str, payload: bytes, timeout_s: float = 60, resident_only: bool = False
    ) -> JobResult:
        """`resident_only` (a leased job): NotResident rather than load the model."""
        state = self.units.get(unit_id)
        if state is None:
            raise UnknownUnit(f"unit: {unit_id!r} is not a unit of this node")
        artifact = self.store.get(digest)
        if artifact is None:
            raise UnknownModel(f"model: {digest[:12]}… has not been uploaded to this node")
        self._check_open(state)
        waited = tracing.current()  # the wait for the unit (a job running on it, or a reconfiguration)
        with state.lock:
            if waited is not None:
                tracing.record("gpu_manager.unit_wait", waited, waited.at_ns, attributes={"faas_gpu.unit": unit_id})
            self._check_open(state)  # drained or retired while this job waited for the unit
            if resident_only and not self._resident(artifact.digest, state):
                raise NotResident(f"model: {digest[:12]}… is not loaded on unit {unit_id}")
            state.busy_since, state.running = time.monotonic(), digest
            try:
                return self._run_locked(state, artifact, payload, timeout_s)
            finally:
                state.busy_s += time.monotonic() - state.busy_since
                state.busy_since, state.running = None, None

    def _resident(self, digest: str, state: _UnitState) -> bool:
        worker = self.workers.get((digest, state.info.id))
        return worker is not None and worker.alive

    @staticmethod
    def _check_open(state: _UnitState) -> None:
        if state.retired:
            raise UnitDraining(f"unit {state.info.id}: gone (its GPU was reconfigured)")
        if state.draining:
            raise UnitDraining(f"unit {state.info.id}: draining for a reconfiguration")

    def _run_locked(self, state: _UnitState, artifact: Artifact, payload: bytes, timeout_s: float) -> JobResult:
        key = (artifact.digest, state.info.id)
        for attempt in (1, 2):
            worker = self.workers.get(key)
            hit = worker is not None and worker.alive
            load_s, split = 0.0, None
            if not hit:
                self._misses.labels(state.info.id).inc()
                t0 = time.perf_counter()
                with tracing.span("gpu_manager.load", attributes={"faas_gpu.unit": state.info.id}):
                    worker = self._load(state, artifact)
                load_s = time.perf_counter() - t0
                split = load_split(worker)
                self._loads.labels(state.info.id).inc()
                self._load_seconds.labels(state.info.id).observe(load_s)
            else:
                self._hits.labels(state.info.id).inc()
                state.cache.touch(artifact.digest)
            t0 = time.perf_counter()
            try:
                with tracing.span("gpu_manager.execute", attributes={"faas_gpu.unit": state.info.id}):
                    out = worker.run(payload, timeout_s)
            except DeviceFault as exc:  # not the input's fault: the context is gone, and under MPS the server's
                log.error("device fault under %s on %s (%s); replacing it", artifact.digest[:12], state.info.id, exc)
                self._device_fault(state, key)
                if attempt == 2:
                    raise
                continue
            except WorkerDied as exc:
                log.warning("worker for %s on %s died (%s); replacing it", artifact.digest[:12], state.info.id, exc)
                self._drop(key, state)
                if attempt == 2:
                    raise
                continue
            except OutOfDeviceMemory as exc:  # the batch's activations: room from the other models, once
                others = [d for d in state.cache.models if d != artifact.digest]
                if attempt == 2 or not others:
                    raise BatchDoesNotFit(
                        f"unit {state.info.id}: the batch does not fit with the model alone on it ({exc})"
                    ) from None
                log.warning(
                    "batch of %s on %s out of memory; evicting %d models",
                    artifact.digest[:12],
                    state.info.id,
                    len(others),
                )
                self._evict(state, others)
                continue
            execute_s = time.perf_counter() - t0
            self._exec_s[artifact.digest] = 0.7 * self._exec_s.get(artifact.digest, execute_s) + 0.3 * execute_s
            if getattr(worker, "peak_mb", 0.0) > self._accounted.get(key, 0.0):  # a larger batch grew it
                self._account(state, artifact.digest, worker)
            charged = state.cache.size_of(artifact.digest) if artifact.digest in state.cache else 0.0
            return JobResult(out, state.info.id, hit, load_s, execute_s, load_split=split, model_mb=charged)
        raise AssertionError("unreachable")

    def _device_fault(self, state: _UnitState, key: tuple[str, str]) -> None:
        """Replace a faulted worker; under MPS a fatal fault poisons every client of the unit's
        server until all exit, so all the unit's workers and its daemon are restarted."""
        if self.mps is None or state.info.kind == "cpu":
            self._drop(key, state)
            return
        log.error("unit %s: restarting its MPS daemon and %d workers", state.info.id, len(state.cache))
        self._stop_unit(state)  # the next worker's environment starts the daemon again (mps.ensure)

    def _evict(self, state: _UnitState, digests: list[str]) -> None:
        for digest in digests:
            self._drop((digest, state.info.id), state)
            self._evictions.labels(state.info.id).inc()
            self._prepare(state, digest)  # an LRU victim may well come back

    # -- prepared workers (the host-memory tier, `pool.py`) ---------------------------------------
    def uploaded(self, artifact: Artifact) -> bool:
        """A model was uploaded to this node (the scheduler uploads one where it plans to run it):
        prepare it for the unit its first job most likely goes to, the least loaded one that is
        open and has room for it: idle first, then the least memory used, then the fewest models.
        One unit, not every unit's environment: on a GPU node each unit's environment is its own
        (CUDA_VISIBLE_DEVICES), so preparing for all would hold the model once per unit (7 on a
        MIG-sliced GPU) for one miss; cpu units share one environment, so any of them gets it.
        The same unit's idle processes parse the program ahead (`pool.WorkerPool.remember`).
        False when nothing was ordered (the tier off, no unit, already resident or prepared)."""
        open_units = [
            s
            for s in list(self.units.values())
            if not (s.draining or s.retired) and self.cost_mb(artifact, s.info) <= s.info.memory_mb
        ]
        if not open_units:
            return False
        state = min(
            open_units,
            key=lambda s: (s.busy_since is not None, s.cache.used_mb / max(s.info.memory_mb, 1e-9), len(s.cache)),
        )
        ordered = self._prepare(state, artifact.digest)  # first: the preparation takes an idle process
        self._remember(state, artifact)  # then its replacement parses the program (after it, on the pool's thread)
        return ordered

    def _remember(self, state: _UnitState, artifact: Artifact) -> None:
        """Have the unit's idle pooled processes parse the model's program ahead (`WorkerPool.remember`)."""
        env = self._known_env(state.info, artifact.digest)
        if env is not None:
            self.pool.remember(str(artifact.path), env)

    def _prepare(self, state: _UnitState, digest: str) -> bool:
        """Order a prepared worker of `digest` for the unit's environment (on the pool's thread:
        it starts once no load runs on the node, and not at all if the model is loaded there by then)."""
        if self.pool.budget_mb <= 0 or state.draining or state.retired:
            return False
        artifact = self.store.get(digest)
        env = self._known_env(state.info, digest)
        if artifact is None or env is None or self._resident(digest, state):
            return False
        return self.pool.prepare(
            digest,
            str(artifact.path),
            self._device(state.info),
            env,
            state.info.id,
            wanted=lambda: not self._resident(digest, state) and not state.retired,
        )

    def _known_env(self, info: UnitInfo, digest: str) -> dict[str, str] | None:
        """`worker_env` without starting anything: None under MPS while the unit's daemon is not
        running (a preparation does not start a daemon; a miss does, as before)."""
        if info.kind == "cpu" or self.mps is None:
            return self.worker_env(info, digest)
        daemon = getattr(self.mps, "daemons", {}).get(info.id)
        if daemon is None or not daemon.running:
            return None
        return daemon.client_env(self._model_pct.get(digest, self.mps_thread_percentage))

    def _prepared_models(self, info: UnitInfo) -> list[str]:
        """The models a miss on this unit would find prepared (their environment is the unit's)."""
        return sorted(d for d, env, _ in self.pool.prepared() if env == self._known_env(info, d))

    def _parsed_models(self, info: UnitInfo) -> list[str]:
        """The models a miss on this unit would find parsed: the store names files by digest."""
        if self.pool.size == 0 or (self.mps is not None and info.kind != "cpu"):
            return []  # as `_warm_workers`: the environment is not asked for under MPS
        return sorted(Path(p).stem for p in self.pool.parsed(self.worker_env(info, "")))

    def _load(self, state: _UnitState, artifact: Artifact) -> Worker:
        """Make room (memory, and the unit's worker cap), start the worker, then charge what it
        measured. Out of memory at load evicts the unit's other models and tries once more; then
        507 (it does not fit) or 503 (it was measured to fit: memory held elsewhere, retry later)."""
        size = self.cost_mb(artifact, state.info)
        try:
            victims = self._victims(state, size)
        except ModelTooLarge:
            raise ModelDoesNotFit(
                f"model: {size:.0f} MB does not fit unit {state.info.id} ({state.info.memory_mb:.0f} MB)"
            ) from None
        self._evict(state, victims)
        try:
            worker = self._start(state, artifact)
        except OutOfDeviceMemory as exc:
            others = state.cache.models
            if not others:
                self._no_room(state, artifact, exc)
            log.warning(
                "load of %s on %s out of memory; evicting %d models", artifact.digest[:12], state.info.id, len(others)
            )
            self._evict(state, others)
            try:
                worker = self._start(state, artifact)
            except OutOfDeviceMemory as again:
                self._no_room(state, artifact, again)
        state.cache.load(artifact.digest, size)
        self.workers[(artifact.digest, state.info.id)] = worker
        self._remember(state, artifact)  # parsed again for the unit: its return after an eviction binds the weights
        self._account(state, artifact.digest, worker)
        self._accounted[(artifact.digest, state.info.id)] = -1.0  # measured again after its first batch
        return worker

    def _victims(self, state: _UnitState, size: float) -> list[str]:
        """The LRU models to evict for `size` MB, and more while the unit is at its worker cap."""
        return state.cache.victims_for(size, self.worker_cap(state.info))

    def _start(self, state: _UnitState, artifact: Artifact) -> Worker:
        env = self.worker_env(state.info, artifact.digest)
        device = self._device(state.info)
        worker = self.worker_factory(artifact, device, env=env) if env else self.worker_factory(artifact, device)
        worker.start()
        return worker

    def _no_room(self, state: _UnitState, artifact: Artifact, exc: Exception) -> None:
        known = self.costs.get((artifact.digest, device_kind(state.info.kind, state.info.gpu_name)))
        if known is not None and known <= state.info.memory_mb:
            raise DeviceMemoryBusy(
                f"unit {state.info.id}: out of memory loading {artifact.digest[:12]} with the unit emptied, "
                f"though it was measured at {known:.0f} MB of {state.info.memory_mb:.0f}; retry later ({exc})"
            )
        raise ModelDoesNotFit(
            f"model: {artifact.digest[:12]} does not fit unit {state.info.id} "
            f"({state.info.memory_mb:.0f} MB) even alone: {exc}"
        )

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

    def _drop(self, key: tuple[str, str], state: _UnitState) -> None:
        self._accounted.pop(key, None)
        worker = self.workers.pop(key, None)
        if worker is not None:
            worker.stop()
        if key[0] in state.cache:
            state.cache.evict(key[0])

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
        if self.pool.size == 0 or (self.mps is not None and info.kind != "cpu"):
            return 0  # under MPS the unit's environment names its daemon: not asked for here (it may start it)
        return self.pool.ready(self.worker_env(info, ""))

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

    # -- GPU control: geometry ------------------------------------------------------------------
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

    def mig_privilege(self) -> mig.MigPrivilege:
        """May this manager change MIG geometry now: the OS's answer, asked again each time (a
        capability may be granted while it runs), unless NVML itself has refused it already."""
        if self.nvml is None:
            return self.privilege
        if self._nvml_refused is not None:
            return mig.MigPrivilege(False, self._nvml_refused)
        self.privilege = self._probe()
        return self.privilege

    def reconfigure(self, index: int, profiles: list[str], drain_timeout_s: float = 30.0) -> dict:
        """Slice GPU `index` into `profiles` (MIG profile names): {"gpu", "geometry", "units"} after.

        Refuses before touching anything: an invalid geometry (mig.InvalidGeometry), MIG mode off
        (mig.MigModeOff), no such GPU (mig.UnknownGPU), no privilege to change geometry
        (mig.MigNotPermitted: not root, no mig-config capability). Then drains the GPU's units: no new jobs,
        running ones waited for up to `drain_timeout_s` (else mig.UnitsBusy, and the units serve
        again), workers and MPS daemons stopped; applies the geometry; discovers the GPU's units.
        A destroy NVML refuses as in use with no process visible (mig.InstancesInUse) is undone
        before it is raised; an NVML NO_PERMISSION (mig.MigNotPermitted) is remembered, so the next
        attempt is refused before draining.

        Counted in `faas_gpu_mig_reconfigurations_total`: done when the geometry changed, refused
        when nothing was touched, failed when NVML failed mid-way; a GPU this node does not have is
        not counted (its index would be a label anyone could invent).
        """
        try:
            result, changed = self._reconfigure(index, profiles, drain_timeout_s)
        except mig.MigNotPermitted as exc:
            self._reconfigurations.labels(str(index), "refused").inc()
            # NVML refusing a create or destroy says the probe was wrong; an unreadable process list
            # (another user's processes on an instance) is about that instance, now
            if self._nvml_refused is None and self.privilege.allowed and not isinstance(exc, mig.ProcessesUnseen):
                self._nvml_refused = f"NVML refused: {exc}"
                log.warning("MIG geometry control: no (%s)", self._nvml_refused)
            raise
        except (mig.InvalidGeometry, mig.MigModeOff, mig.UnitsBusy, mig.InstancesInUse):
            self._reconfigurations.labels(str(index), "refused").inc()
            raise
        except mig.MigError:
            self._reconfigurations.labels(str(index), "failed").inc()
            raise
        if changed:
            self._reconfigurations.labels(str(index), "done").inc()
        return result

    def _reconfigure(self, index: int, profiles: list[str], drain_timeout_s: float) -> tuple[dict, bool]:
        """The reconfiguration itself: (the GPU's status after, whether its geometry changed)."""
        if self.nvml is None:
            raise mig.UnknownGPU(f"gpu {index}: this manager has no GPU control (its back end has no GPUs)")
        with self._reconfiguring:
            plan = mig.check_geometry(self.nvml, index, profiles)
            states = [s for s in self.units.values() if s.info.kind != "cpu" and s.info.index == index]
            if not plan.changes:
                return self._gpu_status(index, [i.profile for i in sorted(plan.keep, key=lambda i: i.start)]), False
            privilege = self.mig_privilege()
            if not privilege.allowed:  # before draining: nothing stopped for a change that cannot happen
                raise mig.MigNotPermitted(index, privilege.reason)
            held = self._drain(index, states, drain_timeout_s)
            try:
                for s in states:
                    self._stop_unit(s)
                error: Exception | None = None
                geometry: list[str] = []
                try:
                    geometry = mig.apply_geometry(
                        self.nvml, index, profiles, busy=lambda: [s.info.id for s in states if s.busy_since is not None]
                    )
                except mig.MigError as exc:  # the GPU may be half-way: what exists now is what we serve
                    error = exc
                try:
                    found = [u for u in discover_units(self.nvml) if u.index == index and u.kind != "cpu"]
                except Exception as exc:  # NVML gone mid-way: keep the old units, drained no more
                    for s in states:
                        s.draining = False
                    raise mig.MigError(f"gpu {index}: rediscovering its units failed: {exc}") from exc
                self._replace_units(states, found)
                if error is not None:
                    raise error
            finally:
                for s in held:
                    s.lock.release()
                self._changed()
            log.info("gpu %d: geometry %s, units %s", index, geometry, [u.id for u in found])
            return self._gpu_status(index, geometry), True

    def _gpu_status(self, index: int, geometry: list[str]) -> dict:
        ids = {s.info.id for s in self.units.values() if s.info.kind != "cpu" and s.info.index == index}
        return {"gpu": index, "geometry": geometry, "units": [u for u in self.status() if u["unit"] in ids]}

    def _drain(self, index: int, states: list[_UnitState], timeout_s: float) -> list[_UnitState]:
        """No new jobs on these units; hold each one's lock once its running job ended."""
        for s in states:
            s.draining = True
        self._changed()  # out of the datastore: the scheduler stops placing on them
        deadline = time.monotonic() + max(0.0, timeout_s)
        held: list[_UnitState] = []
        for s in states:
            if s.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                held.append(s)
                continue
            busy = [x.info.id for x in states if x.busy_since is not None] or [s.info.id]
            for h in held:
                h.lock.release()
            for x in states:
                x.draining = False
            self._changed()
            raise mig.UnitsBusy(index, busy)
        return held

    def _stop_unit(self, state: _UnitState) -> None:
        for key in [k for k in list(self.workers) if k[1] == state.info.id]:  # list(): jobs elsewhere add workers
            self._drop(key, state)
        # its prepared workers too: their environment names a device (or daemon) that may not exist after
        uid, env = state.info.id, self.worker_env(state.info, "") if self.mps is None else None
        self.pool.discard_prepared(lambda p, e: p.unit == uid or e == env)
        if self.mps is None:  # its idle pooled workers would hold a device that may not exist after
            self.pool.discard(self.worker_env(state.info, ""))
        else:
            self.mps.stop(state.info.id)

    def _replace_units(self, old: list[_UnitState], found: list[UnitInfo]) -> None:
        """The GPU's units as NVML now has them: a kept unit serves again, a gone one is retired."""
        by_id = {u.id: u for u in found}
        units = dict(self.units)  # a new dict: readers iterating the old one are not disturbed
        for s in old:
            if by_id.get(s.info.id) == s.info:
                s.draining = False
                continue
            s.retired = True
            units.pop(s.info.id, None)
        for u in found:
            if u.id not in units:
                units[u.id] = self._state(u)
        self.units = units

    def _changed(self) -> None:
        for listener in self.on_units_changed:
            try:
                listener()
            except Exception as exc:  # a datastore hiccup must not fail the reconfiguration
                log.warning("units-changed listener failed: %s", exc)

    def close(self) -> None:
        self.pool.close()
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()
        if self.mps is not None:
            self.mps.stop_all()
