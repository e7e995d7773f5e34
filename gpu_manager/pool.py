"""A warm pool of worker processes: a cache miss takes a process that has torch imported and its
loader warmed, instead of paying a fresh interpreter, `import torch` and the export loader's
first-use set-up (~1-2 s of a miss here) on the job's path.

One pool per worker environment (`env`: the unit's CUDA_VISIBLE_DEVICES, and with MPS its pipe
directory and share). A pooled process is spawned with its unit's environment already set, so
CUDA — which reads these variables once, when it initialises — sees the right device whatever
torch or its export machinery touches while warming. The other way (one pool for all units,
the environment set when a model is assigned) would need every import and warm-up step to keep
off CUDA, which torch does not promise (`torch.cuda.is_available()` initialises the driver);
the price of the per-unit way is one idle process per unit (~300 MB of host memory, no CUDA
context). A model whose MPS share differs from its unit's default gets a fresh process.

Processes are spawned by one long-lived thread of the pool: a worker dies with the thread that
spawned it (`die_with_parent`), so no short-lived request thread may spawn one. A pool never
spawns while a taken process loads: `refill` is called once the load finished.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

EnvKey = tuple[tuple[str, str], ...]


def env_key(env: dict[str, str] | None) -> EnvKey:
    return tuple(sorted((env or {}).items()))


@dataclass
class Pooled:
    """A spawned worker process waiting for its model's load order on `conn`."""

    proc: Any
    conn: Connection
    env: dict[str, str]
    spawned_at: float = field(default_factory=time.monotonic)


class WorkerPool:
    def __init__(self, size: int, threads: int, spawn: Any):
        """size: idle processes kept per environment (0: no pool, every miss spawns).
        spawn(threads, env) -> Pooled: starts one pooled process (the worker module's)."""
        self.size, self.threads, self._spawn = max(0, size), threads, spawn
        self._idle: dict[EnvKey, list[Pooled]] = {}
        self._lock = threading.Lock()
        self._orders: queue.Queue[tuple[dict[str, str], threading.Event] | None] = queue.Queue()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.spawned = 0  # processes spawned by the pool, for tests and the benchmark

    def _spawner(self) -> None:
        while True:
            order = self._orders.get()
            if order is None:
                return
            env, done = order
            try:
                self._top_up(env)
            except Exception as exc:  # a failed spawn leaves the pool short: the next miss spawns itself
                log.warning("worker pool: spawning a warm worker failed: %s", exc)
            finally:
                done.set()

    def _top_up(self, env: dict[str, str]) -> None:
        key = env_key(env)
        while True:
            with self._lock:
                idle = self._idle.setdefault(key, [])
                idle[:] = [p for p in idle if p.proc.is_alive()]
                if self._closed or len(idle) >= self.size:
                    return
            pooled = self._spawn(self.threads, dict(env))
            with self._lock:
                if self._closed:
                    stop(pooled)
                    return
                self._idle[key].append(pooled)
                self.spawned += 1

    def refill(self, env: dict[str, str] | None, wait: bool = False) -> None:
        """Bring the environment's idle processes back to `size`, on the pool's own thread."""
        if self.size == 0 or self._closed:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._spawner, name="worker-pool", daemon=True)
                self._thread.start()
        done = threading.Event()
        self._orders.put((dict(env or {}), done))
        if wait:
            done.wait()

    def take(self, env: dict[str, str] | None) -> Pooled | None:
        """The oldest idle process for this environment (the furthest in its warm-up), or None."""
        with self._lock:
            idle = self._idle.get(env_key(env), [])
            while idle:
                pooled = idle.pop(0)
                if pooled.proc.is_alive():
                    return pooled
                stop(pooled)
        return None

    def idle(self, env: dict[str, str] | None = None) -> int:
        with self._lock:
            return sum(1 for p in self._idle.get(env_key(env), []) if p.proc.is_alive())

    def ready(self, env: dict[str, str] | None = None) -> int:
        """Idle processes that finished warming (torch imported, loader warmed)."""
        with self._lock:
            return sum(1 for p in self._idle.get(env_key(env), []) if p.proc.is_alive() and p.conn.poll(0))

    def discard(self, env: dict[str, str] | None) -> None:
        """Stop the environment's idle processes (its unit is gone or being reconfigured)."""
        with self._lock:
            idle = self._idle.pop(env_key(env), [])
        for pooled in idle:
            stop(pooled)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._idle = list(self._idle.values()), {}
        self._orders.put(None)
        for idle in pools:
            for pooled in idle:
                stop(pooled)


def stop(pooled: Pooled) -> None:
    end(pooled.proc, pooled.conn)


def end(proc: Any, conn: Connection | None) -> None:
    """A worker process's end, pooled or serving: its pipe closed, then SIGTERM, then SIGKILL."""
    if conn is not None:
        conn.close()
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
