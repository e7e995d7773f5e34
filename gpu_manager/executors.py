"""What runs a unit's loaded models: the unit executor, behind a small interface.

The job path (`jobs.py`) decides what is loaded where: the unit's `ModelCache`, its worker cap,
the evictions, the accounting (`accounting.py`). An executor holds the loaded models and what
their next misses may start from, and nothing else: a loaded model is a handle with the
`Worker`'s face (`start`, `run`, `alive`, `stop`, and where measured `info`, `peak_mb`,
`now_mb`). Today's executor, `ProcessExecutor`, runs one worker process per (model, unit); a
second one (the models of a unit sharing one worker process) will go beside it, behind the same
`UnitExecutor`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from faas_gpu.models import Artifact
from faas_gpu.sandbox.worker import Walls

from .pool import WorkerPool
from .worker import Worker, spawn_pooled

Key = tuple[str, str]  # (model digest, unit id)


class UnitExecutor(Protocol):
    """Holds the loaded models of every unit, by (digest, unit), and starts and stops them.

    Environments (`env`) are a unit's worker environment (`GPUManager.worker_env`): its device,
    its MPS daemon and share. The host-memory tier (warm, prepared and parsed workers) is an
    executor's own business: one without it answers none (0, [], False)."""

    workers: dict[Key, Worker]  # the loaded models' handles (a dead one stays until replaced or stopped)

    def start(self, artifact: Artifact, device: str, env: dict[str, str]) -> Worker:
        """Load a model on a device: its handle, started (OutOfDeviceMemory when it does not fit)."""
        ...

    def stop(self, key: Key) -> None:
        """Stop a loaded model's handle, if there is one (its memory is freed)."""
        ...

    def stop_unit(self, unit: str, env: dict[str, str] | None) -> None:
        """Drop what was kept ahead for a unit being reconfigured: its prepared models, and the
        idle workers of `env` (None: none, the environment names an MPS daemon stopped anyway)."""
        ...

    @property
    def prepares(self) -> bool:
        """Whether models may be prepared ahead at all (the host-memory budget is not 0)."""
        ...

    def prepare(
        self, digest: str, path: str, device: str, env: dict[str, str], unit: str, wanted: Callable[[], bool]
    ) -> bool:
        """Order a model prepared for an environment; False when nothing was ordered."""
        ...

    def remember(self, path: str, env: dict[str, str]) -> None:
        """Have the environment's idle workers parse a model's program ahead."""
        ...

    def refill(self, env: dict[str, str]) -> None:
        """Keep warm workers ready for the environment's next misses."""
        ...

    def warm(self, env: dict[str, str]) -> int:
        """Warm workers ready for the environment's next miss."""
        ...

    def prepared(self) -> list[tuple[str, dict[str, str]]]:
        """(digest, environment) of each model held prepared."""
        ...

    def parsed(self, env: dict[str, str]) -> list[str]:
        """The models (digests) an idle worker of the environment holds parsed."""
        ...

    def close(self) -> None:
        """Stop every loaded model and everything kept ahead."""
        ...


class ProcessExecutor:
    """One worker process per (model, unit): the model's memory is its process's, freed when it
    stops; a miss takes a warm pooled process, or a prepared one holding the model read ahead
    (`pool.WorkerPool`)."""

    def __init__(
        self,
        threads: int,
        worker_factory: Callable[..., Worker] | None,
        *,
        warm_workers: int = 0,
        prepared_mb: float = 0.0,
        parsed_programs: int = 8,
        walls: Walls | None = None,
    ):
        """worker_factory: None for the default (torch) workers, which alone use the pool."""
        self.threads = threads
        self.workers: dict[Key, Worker] = {}
        # the back end: real torch workers (cpu, cuda), or the sim back end's profiled workers
        self.pool = WorkerPool(
            warm_workers if worker_factory is None else 0,
            self.threads,
            functools.partial(spawn_pooled, walls=walls),
            budget_mb=prepared_mb if worker_factory is None else 0.0,
            parse_max=parsed_programs,
        )
        self.worker_factory: Callable[..., Worker] = worker_factory or (
            lambda artifact, device, env=None: Worker(
                artifact, device, self.threads, env=env, pool=self.pool, walls=walls
            )
        )

    def start(self, artifact: Artifact, device: str, env: dict[str, str]) -> Worker:
        worker = self.worker_factory(artifact, device, env=env) if env else self.worker_factory(artifact, device)
        worker.start()
        return worker

    def stop(self, key: Key) -> None:
        worker = self.workers.pop(key, None)
        if worker is not None:
            worker.stop()

    def stop_unit(self, unit: str, env: dict[str, str] | None) -> None:
        # its prepared workers too: their environment names a device (or daemon) that may not exist after
        self.pool.discard_prepared(lambda p, e: p.unit == unit or e == env)
        if env is not None:  # its idle pooled workers would hold a device that may not exist after
            self.pool.discard(env)

    @property
    def prepares(self) -> bool:
        return self.pool.budget_mb > 0

    def prepare(
        self, digest: str, path: str, device: str, env: dict[str, str], unit: str, wanted: Callable[[], bool]
    ) -> bool:
        return self.pool.prepare(digest, path, device, env, unit, wanted=wanted)

    def remember(self, path: str, env: dict[str, str]) -> None:
        self.pool.remember(path, env)

    def refill(self, env: dict[str, str]) -> None:
        self.pool.refill(env)

    def warm(self, env: dict[str, str]) -> int:
        return 0 if self.pool.size == 0 else self.pool.ready(env)

    def prepared(self) -> list[tuple[str, dict[str, str]]]:
        return [(d, env) for d, env, _ in self.pool.prepared()]

    def parsed(self, env: dict[str, str]) -> list[str]:
        """The store names files by digest: a parsed program's file stem is its model."""
        if self.pool.size == 0:
            return []
        return sorted(Path(p).stem for p in self.pool.parsed(env))

    def close(self) -> None:
        self.pool.close()
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()
