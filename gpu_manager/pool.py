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

**Prepared workers** (a host-memory tier, as ServerlessLLM keeps checkpoints in host DRAM and
Triton separates loading a model repository from serving): a pooled process given one artifact
to read and check into host memory (`loader.prepare`: safe_formats' checks, torch's export
deserializer, the module; CUDA untouched, so it holds no context and no device memory), kept per
(model digest, environment). A miss on that model in that environment takes it and pays only the
copy to the device and the warm-up. The deserializer's cost is fixed per program (~0.35 s for
the 246-node embed program, against ~50 ms of weights), so this is the only way a miss from a
parsed program's format approaches the bandwidth. Bounded by a host-memory budget (`budget_mb`,
each worker's measured USS: interpreter, torch and the model), least recently prepared or
asked-for dropped first. Preparations run on the pool's thread, one at a time, and start only
while no load runs on the node (`loading()`): they never take a job's CPU at its start; a load
that begins during one runs beside it (one process, ~0.4 s for the embed model). A miss on a
model whose preparation is under way waits for it rather than read the same file again beside it.

**Programs parsed ahead** (`remember`): the idle processes of an environment also parse the
programs likely to run there (uploaded to the node for one of its units, or loaded on one) and
keep them as skeletons without weights (`weights.py`; the `parse_max` most recent, about 10 MB
each for the embed example's program), so a miss pays neither torch's parse nor a copy: its
read maps the weights from the store. This tier holds no weights, so unlike the prepared one
it needs no memory budget; a process taken for a miss leaves with its skeletons, and its
replacement parses them again (in the background, one at a time, never beside a load). A miss
that finds the environment's only idle process parsing waits for it (`TAKE_WAIT_S`) rather than
spawn. A program whose parse fails, or kills or hangs the process, is never parsed ahead again
(its miss loads it whole, as before).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

EnvKey = tuple[tuple[str, str], ...]


def host_share_mb(share: float = 0.25, meminfo: str = "/proc/meminfo") -> float:
    """`share` of the node's memory (MemTotal), in MB: the prepared workers' default budget.
    0 where /proc/meminfo cannot be read (the tier is then off unless sized explicitly)."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return share * int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def env_key(env: dict[str, str] | None) -> EnvKey:
    return tuple(sorted((env or {}).items()))


@dataclass
class Pooled:
    """A spawned worker process waiting for its model's load order on `conn`."""

    proc: Any
    conn: Connection
    env: dict[str, str]
    spawned_at: float = field(default_factory=time.monotonic)
    warm: bool = False  # its warm-up report was read (by the pool, parsing into it)
    parsed: OrderedDict[str, None] = field(default_factory=OrderedDict)  # programs it holds parsed, oldest first


@dataclass
class PreparedWorker:
    """A pooled process holding one artifact read and checked in host memory, for one environment
    and device, waiting for the miss that takes it (`Worker` sends it the load order)."""

    pooled: Pooled
    digest: str
    path: str
    device: str
    unit: str  # the unit it was prepared for (any unit with the same environment may take it)
    prepare_s: float  # the read's own time, in the worker
    host_mb: float  # the process's private memory after the read (interpreter, torch, the model)
    ready_at: float = field(default_factory=time.monotonic)


PREPARE_TIMEOUT_S = 300.0
PARSE_TIMEOUT_S = 300.0
TAKE_WAIT_S = 10.0  # a miss waits this long for a process busy parsing (a parse: ~0.5 s; a spawn: seconds)

PreparedKey = tuple[str, EnvKey]


class WorkerPool:
    def __init__(self, size: int, threads: int, spawn: Any, budget_mb: float = 0.0, parse_max: int = 8):
        """size: idle processes kept per environment (0: no pool, every miss spawns).
        spawn(threads, env) -> Pooled: starts one pooled process (the worker module's).
        budget_mb: host memory for prepared workers (0: none are kept).
        parse_max: programs each idle process holds parsed, per environment (0: none)."""
        self.size, self.threads, self._spawn = max(0, size), threads, spawn
        self.budget_mb = max(0.0, budget_mb)
        self.parse_max = max(0, parse_max)
        self._programs: dict[EnvKey, OrderedDict[str, None]] = {}  # to hold parsed, per environment, oldest first
        self._unparsable: set[str] = set()  # programs a process could not parse (TorchScript, ...): not again
        self._busy: dict[EnvKey, int] = {}  # idle processes out of `_idle` while they parse
        self._parsing: list[Pooled] = []  # those processes (`close` stops them too)
        self._generation: dict[EnvKey, int] = {}  # bumped by `discard`: a parse ending after it stops its process
        self.parsed_count = 0  # programs parsed into pooled processes, for tests and the benchmark
        self._idle: dict[EnvKey, list[Pooled]] = {}
        self._lock = threading.Lock()
        self._no_loads = threading.Condition(self._lock)
        self._back = threading.Condition(self._lock)  # a process came back from parsing
        self._loads = 0  # loads running on the node now: no preparation starts meanwhile
        self._prepared: OrderedDict[PreparedKey, PreparedWorker] = OrderedDict()  # least recent first
        self._preparing: dict[PreparedKey, tuple[threading.Event, list[bool]]] = {}  # (done, [started])
        self._orders: queue.Queue[tuple[Callable[[], None], threading.Event] | None] = queue.Queue()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.spawned = 0  # processes spawned by the pool, for tests and the benchmark
        self.prepared_count = 0  # preparations done, for tests and the benchmark

    def _spawner(self) -> None:
        while True:
            order = self._orders.get()
            if order is None:
                return
            work, done = order
            try:
                work()
            except Exception as exc:  # a failed spawn leaves the pool short: the next miss spawns itself
                log.warning("worker pool: %s", exc)
            finally:
                done.set()

    def _order(self, work: Callable[[], None]) -> threading.Event:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._spawner, name="worker-pool", daemon=True)
                self._thread.start()
        done = threading.Event()
        self._orders.put((work, done))
        return done

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
        """Bring the environment's idle processes back to `size`, on the pool's own thread, and
        parse the environment's programs into them."""
        if self.size == 0 or self._closed:
            return
        env = dict(env or {})
        done = self._order(lambda: self._replenish(env))
        if wait:
            done.wait()

    def _replenish(self, env: dict[str, str]) -> None:
        self._top_up(env)
        self._parse_known(env)

    # -- programs parsed ahead (`weights.py`) ---------------------------------------------------
    def remember(self, path: str, env: dict[str, str] | None, wait: bool = False) -> bool:
        """A program likely to be loaded in `env` (uploaded to the node, or loaded on one of its
        units): parsed into the environment's idle processes on the pool's thread, once no load
        runs, so its miss binds only the weights. The `parse_max` most recent are kept. False
        when nothing was ordered (no pool, or the program cannot be parsed ahead)."""
        if self.size == 0 or self.parse_max == 0 or self._closed:
            return False
        key = env_key(env)
        with self._lock:
            if path in self._unparsable:
                return False
            programs = self._programs.setdefault(key, OrderedDict())
            programs[path] = None
            programs.move_to_end(path)
            while len(programs) > self.parse_max:
                programs.popitem(last=False)
        env = dict(env or {})
        done = self._order(lambda: self._parse_known(env))
        if wait:
            done.wait()
        return True

    def _after_loads(self) -> None:
        """Under the lock: wait until no load runs on the node (background work never runs beside one)."""
        while self._loads and not self._closed:
            self._no_loads.wait(1.0)

    def _parse_known(self, env: dict[str, str]) -> None:
        """Each idle process of `env` given the environment's programs it lacks, most recent first,
        one parse at a time; the process is out of `_idle` meanwhile (a miss waits for it, `take`)."""
        key = env_key(env)
        while True:
            with self._lock:
                self._after_loads()
                if self._closed:
                    return
                wanted = [p for p in reversed(self._programs.get(key, {})) if p not in self._unparsable]
                job = next(
                    (
                        (pooled, path)
                        for pooled in self._idle.get(key, [])
                        if pooled.proc.is_alive()
                        for path in wanted
                        if path not in pooled.parsed
                    ),
                    None,
                )
                if job is None:
                    return
                pooled, path = job
                self._idle[key].remove(pooled)
                self._busy[key] = self._busy.get(key, 0) + 1
                self._parsing.append(pooled)
                generation = self._generation.get(key, 0)
            ok = self._parse_one(pooled, path)
            with self._lock:
                self._busy[key] -= 1
                self._parsing.remove(pooled)
                current = not self._closed and self._generation.get(key, 0) == generation
                if ok and current:
                    self._idle.setdefault(key, []).insert(0, pooled)  # it is the oldest, furthest warmed
                self._back.notify_all()
            if not (ok and current):
                stop(pooled)
            if not ok and current:  # the program that took the process is not asked again: replace it
                self._top_up(env)

    def _parse_one(self, pooled: Pooled, path: str) -> bool:
        """False when the process failed (it is stopped); a program it could not parse is noted
        as such (never asked again: the same file gives the same answer) and the process kept."""
        try:
            pooled.conn.send(("parse", path, self.parse_max))
            kind, value, deadline = "warm", None, time.monotonic() + PARSE_TIMEOUT_S
            while kind == "warm":  # the process's own warm-up report may come first
                if not pooled.conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"not parsed within {PARSE_TIMEOUT_S:.0f}s")
                kind, value = pooled.conn.recv()
                if kind == "warm":
                    pooled.warm = True
        except (EOFError, OSError, TimeoutError, ValueError) as exc:  # ValueError: its pipe closed under it
            if not self._closed:  # a process stopped by `close` mid-parse is no failure
                log.warning("worker pool: parsing %s killed or hung its process (%s); not parsed ahead", path, exc)
                with self._lock:
                    self._unparsable.add(path)
            return False
        if kind != "parsed":
            log.warning("worker pool: parsing %s: unexpected answer %r", path, kind)
            with self._lock:
                self._unparsable.add(path)
            return False
        ok, detail = value
        if not ok:
            log.info("worker pool: %s is loaded whole at its miss: %s", path, detail)
            with self._lock:
                self._unparsable.add(path)
            return True
        pooled.parsed[path] = None
        pooled.parsed.move_to_end(path)
        while len(pooled.parsed) > self.parse_max:  # as the process itself keeps them
            pooled.parsed.popitem(last=False)
        self.parsed_count += 1
        return True

    # -- prepared workers ---------------------------------------------------------------------
    @contextmanager
    def loading(self) -> Iterator[None]:
        """A load runs on the node while inside: no preparation starts until none does."""
        with self._lock:
            self._loads += 1
        try:
            yield
        finally:
            with self._lock:
                self._loads -= 1
                self._no_loads.notify_all()

    def prepare(
        self,
        digest: str,
        path: str,
        device: str,
        env: dict[str, str] | None,
        unit: str,
        wait: bool = False,
        wanted: Callable[[], bool] | None = None,
    ) -> bool:
        """Order a prepared worker for (digest, env) on the pool's thread; False when the tier is
        off, or one is already there or under way (then it only counts as used, for the LRU).
        wanted(): asked again when the preparation may start (the model may have been loaded since)."""
        key = (digest, env_key(env))
        with self._lock:
            if self.budget_mb <= 0 or self._closed:
                return False
            if key in self._prepared:
                self._prepared.move_to_end(key)
                return False
            if key in self._preparing:
                return False
            self._preparing[key] = entry = (threading.Event(), [False])
        env = dict(env or {})
        done = self._order(lambda: self._prepare(key, entry, path, device, env, unit, wanted))
        if wait:
            done.wait()
        return True

    def _prepare(
        self,
        key: PreparedKey,
        entry: tuple[threading.Event, list[bool]],
        path: str,
        device: str,
        env: dict[str, str],
        unit: str,
        wanted: Callable[[], bool] | None,
    ) -> None:
        finished, started = entry
        try:
            with self._lock:
                self._after_loads()
                if self._closed or self._preparing.get(key) is not entry:
                    return
            if wanted is not None and not wanted():
                return
            with self._lock:
                started[0] = True
            prepared = self._prepare_one(key[0], path, device, env, unit)
            if prepared is not None:
                self._keep(key, prepared)  # before `finished`: a miss waiting for it finds it
        finally:
            with self._lock:
                if self._preparing.get(key) is entry:
                    del self._preparing[key]
            finished.set()
        if self.size:
            self._replenish(env)  # the idle process it took, replaced

    def _prepare_one(
        self, digest: str, path: str, device: str, env: dict[str, str], unit: str
    ) -> PreparedWorker | None:
        pooled = self.take(env, wait_s=0)  # on the pool's thread: no parse runs meanwhile
        if pooled is None:
            pooled = self._spawn(self.threads, dict(env))
            self.spawned += 1
        try:
            pooled.conn.send(("prepare", path, device))
            kind, value, deadline = "warm", None, time.monotonic() + PREPARE_TIMEOUT_S
            while kind == "warm":  # the pooled process's own warm-up report comes first
                if not pooled.conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"not prepared within {PREPARE_TIMEOUT_S:.0f}s")
                kind, value = pooled.conn.recv()
        except (EOFError, OSError, TimeoutError) as exc:
            log.warning("worker pool: preparing %s failed: %s", digest[:12], exc)
            stop(pooled)
            return None
        if kind != "prepared":
            log.warning("worker pool: %s not prepared: %s", digest[:12], value)
            stop(pooled)
            return None
        prepare_s, host_mb = value
        self.prepared_count += 1
        return PreparedWorker(pooled, digest, path, device, unit, prepare_s, host_mb)

    def _keep(self, key: PreparedKey, prepared: PreparedWorker) -> None:
        """Into the tier, the least recent dropped while over the budget (the new one too, alone over it)."""
        dropped: list[PreparedWorker] = []
        with self._lock:
            if self._closed:
                dropped.append(prepared)
            else:
                old = self._prepared.pop(key, None)
                if old is not None:
                    dropped.append(old)
                self._prepared[key] = prepared
                while self._prepared and sum(p.host_mb for p in self._prepared.values()) > self.budget_mb:
                    dropped.append(self._prepared.popitem(last=False)[1])
        for p in dropped:
            log.info("worker pool: %s no longer prepared (budget %.0f MB)", p.digest[:12], self.budget_mb)
            stop(p.pooled)

    def take_prepared(
        self, digest: str, env: dict[str, str] | None, device: str, wait_s: float = 0.0
    ) -> PreparedWorker | None:
        """The prepared worker of (digest, env) for `device`, out of the tier, or None. One whose
        preparation has started is waited for (up to `wait_s`): it read the file before this miss."""
        key = (digest, env_key(env))
        with self._lock:
            entry = self._preparing.get(key)
        if entry is not None and entry[1][0]:
            entry[0].wait(wait_s)
        with self._lock:
            prepared = self._prepared.get(key)
            if prepared is None or prepared.device != device:
                return None
            del self._prepared[key]
        if prepared.pooled.proc.is_alive():
            return prepared
        log.warning("worker pool: the prepared worker of %s died; the miss loads from the store", digest[:12])
        stop(prepared.pooled)
        return None

    def prepared(self) -> list[tuple[str, dict[str, str], PreparedWorker]]:
        """(digest, environment, worker) of each prepared worker alive, least recent first."""
        with self._lock:
            items = list(self._prepared.items())
        return [(d, dict(e), p) for (d, e), p in items if p.pooled.proc.is_alive()]

    def prepared_mb(self) -> float:
        with self._lock:
            return sum(p.host_mb for p in self._prepared.values())

    def discard_prepared(self, match: Callable[[PreparedWorker, dict[str, str]], bool]) -> None:
        """Stop the prepared workers `match(worker, env)` names (their unit is gone or reconfigured)."""
        with self._lock:
            keys = [k for k, p in self._prepared.items() if match(p, dict(k[1]))]
            gone = [self._prepared.pop(k) for k in keys]
        for p in gone:
            stop(p.pooled)

    def take(self, env: dict[str, str] | None, path: str | None = None, wait_s: float = TAKE_WAIT_S) -> Pooled | None:
        """An idle process for this environment, or None: one holding `path` parsed if any, else
        the oldest (the furthest in its warm-up). With none idle but one parsing, that one is
        waited for (up to `wait_s`): a parse ends sooner than a fresh process warms."""
        key = env_key(env)
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                idle = self._idle.get(key, [])
                for dead in [p for p in idle if not p.proc.is_alive()]:
                    idle.remove(dead)
                    stop(dead)
                if idle:
                    pooled = next((p for p in idle if path is not None and path in p.parsed), idle[0])
                    idle.remove(pooled)
                    return pooled
                left = deadline - time.monotonic()
                if not self._busy.get(key) or self._closed or left <= 0:
                    return None
                self._back.wait(left)

    def idle(self, env: dict[str, str] | None = None) -> int:
        """The environment's idle processes, those parsing included."""
        key = env_key(env)
        with self._lock:
            busy = 0 if self._closed else self._busy.get(key, 0)
            return sum(1 for p in self._idle.get(key, []) if p.proc.is_alive()) + busy

    def ready(self, env: dict[str, str] | None = None) -> int:
        """Idle processes that finished warming (torch imported, loader warmed); parsing ones are."""
        key = env_key(env)
        with self._lock:
            idle = self._idle.get(key, [])
            busy = 0 if self._closed else self._busy.get(key, 0)
            return sum(1 for p in idle if p.proc.is_alive() and (p.warm or p.conn.poll(0))) + busy

    def parsed(self, env: dict[str, str] | None = None) -> set[str]:
        """The programs some idle process of the environment holds parsed."""
        with self._lock:
            return {path for p in self._idle.get(env_key(env), []) for path in p.parsed}

    def discard(self, env: dict[str, str] | None) -> None:
        """Stop the environment's idle processes (its unit is gone or being reconfigured)."""
        key = env_key(env)
        with self._lock:
            idle = self._idle.pop(key, [])
            self._generation[key] = self._generation.get(key, 0) + 1
            self._programs.pop(key, None)
        for pooled in idle:
            stop(pooled)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._idle = list(self._idle.values()), {}
            pools.append([p.pooled for p in self._prepared.values()])
            pools.append(list(self._parsing))  # the pool's thread stops them too when their parse ends
            self._prepared.clear()
            self._no_loads.notify_all()
            self._back.notify_all()
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
