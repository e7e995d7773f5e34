"""The job path: a job's unit, its model loaded there if it is not (evicting the unit's least
recently used models), its batch run, a dead or faulted worker replaced and the job retried once.

The loaded models themselves are the unit executor's (`executors.py`); this module decides what is
loaded where, through the unit's `ModelCache`, its worker cap and the accounting (`accounting.py`).
The host-memory tier (prepared and parsed models, `pool.py`) is ordered from here too: for the
unit an upload most likely runs on, and for a unit whose cache evicted a model.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from faas_gpu import tracing
from faas_gpu.contract.errors import DeadlineMissed, ModelNotUploaded
from faas_gpu.models import Artifact, ModelStore
from faas_gpu.policies import ModelCache, ModelTooLarge

from .discovery import UnitInfo
from .executors import UnitExecutor
from .memory import device_kind
from .worker import DeviceFault, OutOfDeviceMemory, Worker, WorkerDied

log = logging.getLogger("gpu_manager.manager")  # the name it logged under as one module


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


class JobPath:
    """The `GPUManager`'s job API and run path (a mixin: its state is the manager's, declared
    below). It charges through the accounting (`cost_mb`, `worker_cap`, `_account`), asks the
    administration for a worker's environment (`worker_env`, `_known_env`) and has it restart a
    unit's MPS daemon after a device fault (`_stop_unit`)."""

    store: ModelStore
    units: dict[str, _UnitState]
    executor: UnitExecutor
    mps: Any
    costs: dict[tuple[str, str], float]
    _accounted: dict[tuple[str, str], float]
    _exec_s: dict[str, float]
    _hits: Any
    _misses: Any
    _loads: Any
    _evictions: Any
    _load_seconds: Any

    @staticmethod
    def _device(info: UnitInfo) -> str:
        # a cuda worker sees only its unit (CUDA_VISIBLE_DEVICES = the GPU's or MIG device's UUID)
        return "cpu" if info.kind == "cpu" else "cuda:0"

    def run(
        self,
        digest: str,
        unit_id: str,
        payload: bytes,
        timeout_s: float = 60,
        resident_only: bool = False,
        deadline: float | None = None,
    ) -> JobResult:
        """`resident_only` (a leased job): NotResident rather than load the model. `deadline`
        (`time.monotonic()`, None: none): a job still waiting for its unit then is not run
        (DeadlineMissed), as the scheduler drops a late job rather than start it."""
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
            if deadline is not None and (now := time.monotonic()) >= deadline:
                raise DeadlineMissed(f"on unit {unit_id}", (now - deadline) * 1000)
            if resident_only and not self._resident(artifact.digest, state):
                raise NotResident(f"model: {digest[:12]}… is not loaded on unit {unit_id}")
            state.busy_since, state.running = time.monotonic(), digest
            try:
                return self._run_locked(state, artifact, payload, timeout_s)
            finally:
                state.busy_s += time.monotonic() - state.busy_since
                state.busy_since, state.running = None, None

    def _resident(self, digest: str, state: _UnitState) -> bool:
        worker = self.executor.workers.get((digest, state.info.id))
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
            worker = self.executor.workers.get(key)
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
            self.executor.remember(str(artifact.path), env)

    def _prepare(self, state: _UnitState, digest: str) -> bool:
        """Order a prepared worker of `digest` for the unit's environment (on the pool's thread:
        it starts once no load runs on the node, and not at all if the model is loaded there by then)."""
        if not self.executor.prepares or state.draining or state.retired:
            return False
        artifact = self.store.get(digest)
        env = self._known_env(state.info, digest)
        if artifact is None or env is None or self._resident(digest, state):
            return False
        return self.executor.prepare(
            digest,
            str(artifact.path),
            self._device(state.info),
            env,
            state.info.id,
            wanted=lambda: not self._resident(digest, state) and not state.retired,
        )

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
        self.executor.workers[(artifact.digest, state.info.id)] = worker
        self._remember(state, artifact)  # parsed again for the unit: its return after an eviction binds the weights
        self._account(state, artifact.digest, worker)
        self._accounted[(artifact.digest, state.info.id)] = -1.0  # measured again after its first batch
        return worker

    def _victims(self, state: _UnitState, size: float) -> list[str]:
        """The LRU models to evict for `size` MB, and more while the unit is at its worker cap."""
        return state.cache.victims_for(size, self.worker_cap(state.info))

    def _start(self, state: _UnitState, artifact: Artifact) -> Worker:
        env = self.worker_env(state.info, artifact.digest)
        return self.executor.start(artifact, self._device(state.info), env)

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

    def _drop(self, key: tuple[str, str], state: _UnitState) -> None:
        self._accounted.pop(key, None)
        self.executor.stop(key)
        if key[0] in state.cache:
            state.cache.evict(key[0])
