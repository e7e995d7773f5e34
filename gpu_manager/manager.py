"""The GPU Manager's core: units, their model caches, and the workers that run jobs.

One job at a time per unit (the paper's rule). A job names a model (its artifact's digest) and
a unit; a model not cached on the unit is loaded first, evicting the unit's least recently used
models (the same `ModelCache` policy object the scheduler and the simulator use) and stopping
their workers, which frees their memory. A worker that dies mid-job is replaced and the job is
retried once; the manager itself never goes down with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from faas_gpu.policies import ModelCache, ModelTooLarge

from .discovery import UnitInfo
from .model_store import Artifact, ModelStore
from .worker import Worker, WorkerDied

log = logging.getLogger(__name__)


class UnknownModel(LookupError):
    pass


class UnknownUnit(LookupError):
    pass


class ModelDoesNotFit(ValueError):
    """A model larger than the unit (answered 507 with the sizes)."""


@dataclass
class JobResult:
    payload: bytes
    unit: str
    hit: bool
    load_s: float
    execute_s: float


@dataclass
class _UnitState:
    info: UnitInfo
    cache: ModelCache
    lock: threading.Lock
    busy_since: float | None = None
    running: str | None = None


class GPUManager:
    def __init__(
        self,
        units: list[UnitInfo],
        store: ModelStore,
        *,
        threads_per_worker: int = 1,
        worker_factory: Callable[[Artifact, str], Worker] | None = None,
    ):
        if not units:
            raise ValueError("units: the manager needs at least one unit")
        self.store = store
        self.threads = threads_per_worker
        self.units = {u.id: _UnitState(u, ModelCache(u.memory_mb), threading.Lock()) for u in units}
        self.workers: dict[tuple[str, str], Worker] = {}
        # the back end: real torch workers (cpu, cuda), or the sim back end's profiled workers
        self.worker_factory = worker_factory or (lambda artifact, device: Worker(artifact, device, self.threads))
        self._exec_s: dict[str, float] = {}  # per model, for the estimated finish time

    @staticmethod
    def _device(info: UnitInfo) -> str:
        return "cpu" if info.kind == "cpu" else f"cuda:{info.index}"

    @staticmethod
    def model_mb(artifact: Artifact) -> float:
        """Memory a model takes on a unit: its artifact's size (weights dominate it)."""
        return artifact.size / (1024 * 1024)

    def run(self, digest: str, unit_id: str, payload: bytes, timeout_s: float = 60) -> JobResult:
        state = self.units.get(unit_id)
        if state is None:
            raise UnknownUnit(f"unit: {unit_id!r} is not a unit of this node")
        artifact = self.store.get(digest)
        if artifact is None:
            raise UnknownModel(f"model: {digest[:12]}… has not been uploaded to this node")
        with state.lock:
            state.busy_since, state.running = time.monotonic(), digest
            try:
                return self._run_locked(state, artifact, payload, timeout_s)
            finally:
                state.busy_since, state.running = None, None

    def _run_locked(self, state: _UnitState, artifact: Artifact, payload: bytes, timeout_s: float) -> JobResult:
        key = (artifact.digest, state.info.id)
        for attempt in (1, 2):
            worker = self.workers.get(key)
            hit = worker is not None and worker.alive
            load_s = 0.0
            if not hit:
                t0 = time.perf_counter()
                worker = self._load(state, artifact)
                load_s = time.perf_counter() - t0
            else:
                state.cache.touch(artifact.digest)
            t0 = time.perf_counter()
            try:
                out = worker.run(payload, timeout_s)
            except WorkerDied as exc:
                log.warning("worker for %s on %s died (%s); replacing it", artifact.digest[:12], state.info.id, exc)
                self._drop(key, state)
                if attempt == 2:
                    raise
                continue
            execute_s = time.perf_counter() - t0
            self._exec_s[artifact.digest] = 0.7 * self._exec_s.get(artifact.digest, execute_s) + 0.3 * execute_s
            return JobResult(out, state.info.id, hit, load_s, execute_s)
        raise AssertionError("unreachable")

    def _load(self, state: _UnitState, artifact: Artifact) -> Worker:
        size = self.model_mb(artifact)
        try:
            victims = state.cache.victims_for(size)
        except ModelTooLarge:
            raise ModelDoesNotFit(
                f"model: {size:.0f} MB does not fit unit {state.info.id} ({state.info.memory_mb:.0f} MB)"
            ) from None
        for victim in victims:
            self._drop((victim, state.info.id), state)
        worker = self.worker_factory(artifact, self._device(state.info))
        worker.start()
        state.cache.load(artifact.digest, size)
        self.workers[(artifact.digest, state.info.id)] = worker
        return worker

    def _drop(self, key: tuple[str, str], state: _UnitState) -> None:
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
                "memory_mb": s.info.memory_mb,
                "used_mb": s.cache.used_mb,
                "state": "busy" if s.busy_since is not None else "idle",
                "busy_for_s": (now - s.busy_since) if s.busy_since is not None else 0.0,
                "estimated_finish_s": self._finish_estimate(s, now),
                "models": s.cache.models,
            }
            for s in self.units.values()
        ]

    def _finish_estimate(self, s: _UnitState, now: float) -> float:
        """Seconds until the running job should end, from the model's recent execution times."""
        if s.busy_since is None or s.running is None:
            return 0.0
        return max(0.0, self._exec_s.get(s.running, 0.0) - (now - s.busy_since))

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()
