"""A model worker: one process per (model, unit), as in the GPU-FaaS paper's GPU Manager.

The process loads the artifact on its device once (TorchScript or a `torch.export` program,
never a pickle: `safe_formats` says why these are safe and checks the file again here, whatever
the store on disk holds) and then runs batches sent over a pipe as wire-format tensors. Loading
and running user models happens here, never in the manager, so a model that crashes or hangs
takes down only its worker; and every worker process, fresh or pooled, enters its walls
(`isolation.py`: an unprivileged uid, no network, nothing of the state folder, writes only to a
private scratch) before it reads anything uploaded, so a loader bug gains nothing either.

A miss takes a warm process from the `WorkerPool` (torch imported, loader warmed, its unit's
environment set) when the manager keeps one, and spawns one otherwise; either way the worker
reports its load split (spawn, read, to-device, warm-up) in `LoadedInfo`.

A miss on a model the node holds **prepared** (`pool.py`'s host-memory tier: a pooled process
that already read and checked this artifact for this unit's environment, no CUDA touched) takes
that process instead: its load is only the copy to the device and the warm-up (read 0, done
ahead; `prepare_s` and `prepared_ahead_s` say how long it took and how long before the miss).

A pooled process also parses, while it waits, the programs the pool names for its environment
(`loader.parse`: the module without weights); a miss on one of them binds only the weights from
the store (`loader.fill`; `parsed` and `parse_s` in `LoadedInfo`).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.connection import Connection

from faas_gpu.models import Artifact
from faas_gpu.procs import die_with_parent
from faas_gpu.walls import Walls, enter

from . import faults, loader
from .handover import Receiver, Sender
from .memory import WorkerMeter
from .pool import Pooled, PreparedWorker, WorkerPool
from .pool import end as end_process
from .pool import stop as stop_pooled

log = logging.getLogger(__name__)

_CTX = mp.get_context("spawn")  # no fork of a threaded manager; CUDA needs spawn anyway


class WorkerError(Exception):
    pass


class ModelLoadError(WorkerError):
    """The artifact would not load on this device."""


class LoadLost(ModelLoadError):
    """The worker died or stopped answering while it loaded: the kernel's OOM killer, a crash in
    torch, a machine too busy to load within the time. Not the caller's error: answered 503, so
    the scheduler places the job again, rather than the 400 of an artifact that will not load."""


class ModelInputError(WorkerError):
    """The model refused the batch (wrong shape or dtype): its message goes back to the caller."""


class WorkerDied(WorkerError):
    """The process died (or stopped answering) mid-job; the manager replaces it."""


class DeviceFault(WorkerDied):
    """The device failed under the worker (`torch.AcceleratorError`, a sticky CUDA error): its
    context is lost, so the worker exited; under MPS every client of the unit's server is too."""


class OutOfDeviceMemory(WorkerError):
    """The model or its batch did not fit in the memory left on the unit (not the caller's fault)."""


@dataclass(frozen=True)
class LoadedInfo:
    """A worker's load, timed part by part: spawn (a fresh process: interpreter and torch import;
    a pooled one: the hand-over) + read + to_device + optimize + warmup is the miss's cost before the
    job runs. load_s = read_s + to_device_s + optimize_s + warmup_s, measured in the worker; spawn_s
    by the manager's side."""

    param_bytes: int
    load_s: float
    memory_mb: float = 0.0  # the model's cost after the load: cpu USS growth, cuda torch-reserved (no context)
    process_mb: float = 0.0  # the worker before any model (interpreter and torch; host memory)
    read_s: float = 0.0
    to_device_s: float = 0.0
    warmup_s: float = 0.0
    warmup_skipped: str | None = None  # why no warm-up batch ran (no example input), None when one did
    optimize_s: float = 0.0  # the inference rewrites and their check (`optimize.py`)
    optimized: tuple[str, ...] = ()  # the rewrites kept
    optimize_skipped: str | None = None  # why none was
    spawn_s: float = 0.0
    pooled: bool = False  # a warm process from the pool, not a fresh spawn
    cuda_visible_devices: str | None = None  # as the worker process saw it when it loaded
    prepared: bool = False  # a prepared process: the read was done ahead, in host memory
    prepare_s: float = 0.0  # that read's own time (checks, torch's loader, the module), off the miss
    prepared_ahead_s: float = 0.0  # how long before the miss the preparation was done
    parsed: bool = False  # a pooled process had parsed the program ahead: the read bound only the weights
    parse_s: float = 0.0  # that parse's own time, off the miss


def _load(path: str, device: str, skeleton: loader.Skeleton | None = None) -> loader.Loaded:
    """The model on its device, warmed up by one batch of its example input (`loader` says how):
    its weights bound into the skeleton a pooled process parsed ahead, else torch's whole load."""
    if skeleton is not None:
        try:
            return loader.ready(loader.fill(skeleton, device), device)
        except Exception as exc:
            if faults.classify(exc) in (faults.OOM, faults.DEVICE):  # the load's own failure, reported as such
                raise
            log.warning("worker: the parsed program did not bind (%s: %s); loading it whole", type(exc).__name__, exc)
    return loader.ready(loader.load(path, device), device)


def _walled(walls: Walls | None) -> None:
    """First thing in a worker process, before it reads anything uploaded: its walls
    (`isolation.py`; entered while the process is single-threaded), then its death with the
    manager (after: a change of uid clears the death signal)."""
    if walls is not None:
        enter(walls)
    die_with_parent(parent_pid=mp.parent_process().pid)  # a killed manager leaves no worker behind


def _fresh(conn: Connection, path: str, device: str, threads: int, env: dict[str, str], walls: Walls | None) -> None:
    """A worker spawned for one model (no pooled process was ready)."""
    _walled(walls)
    _serve(conn, path, device, threads, env)


def _serve(
    conn: Connection, path: str, device: str, threads: int, env: dict[str, str], skeleton: loader.Skeleton | None = None
) -> None:
    os.environ.update(env)  # CUDA_VISIBLE_DEVICES, MPS pipes and share: read when CUDA starts, below
    import torch

    torch.set_num_threads(threads)
    meter = WorkerMeter(device, torch)  # the baseline before the model: its cost is the growth
    parse_s = skeleton.parse_s if skeleton is not None else 0.0
    _load_and_serve(conn, lambda: _load(path, device, skeleton), device, torch, meter, parse_s=parse_s)


def _load_and_serve(
    conn: Connection, load, device: str, torch, meter: WorkerMeter, prepare_s: float = 0.0, parse_s: float = 0.0
) -> None:
    """`load()` -> loader.Loaded, its answer to the manager, then batches."""
    t0 = time.perf_counter()
    try:
        loaded = load()
        model = loaded.model
        tensors = list(model.parameters()) + list(model.buffers()) if hasattr(model, "parameters") else []
        size = sum(t.numel() * t.element_size() for t in tensors)
    except Exception as exc:  # reported to the manager, which answers the caller (MemoryError too)
        kind = "oom" if faults.classify(exc) == faults.OOM else "error"
        conn.send((kind, f"{type(exc).__name__}: {exc}"))
        return
    info = LoadedInfo(
        size,
        time.perf_counter() - t0,
        meter.cost_mb()[1],
        meter.process_mb,
        read_s=loaded.read_s,
        to_device_s=loaded.to_device_s,
        warmup_s=loaded.warmup_s,
        warmup_skipped=loaded.warmup_skipped,
        optimize_s=loaded.optimize_s,
        optimized=loaded.optimized,
        optimize_skipped=loaded.optimize_skipped,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        prepared=prepare_s > 0,
        prepare_s=prepare_s,
        parsed=loaded.parsed,
        parse_s=parse_s if loaded.parsed else 0.0,
    )
    conn.send(("ready", info))
    _serve_batches(conn, model, device, torch, meter)


def _serve_batches(conn: Connection, model, device: str, torch, meter) -> None:
    """Batches until the pipe closes. Each answer carries the model's peak cost so far (its
    activations grow with the batch) and what it holds now. An input error answers `er` and serves on; out of memory
    answers `om` (the allocator's cache emptied first); a device fault answers `df` and ends the
    process, since its CUDA context is lost for good."""
    from faas_gpu.contract.wire import decode, encode

    batches = Receiver()
    while True:
        x = y = None  # the last batch's views of the shared buffer go before the next is written
        try:
            payload = batches.receive(conn)
        except (EOFError, OSError):
            return
        try:
            x = decode(payload).to(device)
            with torch.inference_mode():
                y = model(x)
            if isinstance(y, tuple | list):
                y = y[0]
            out = encode(y)
            conn.send_bytes(b"ok" + struct.pack("<dd", *meter.cost_mb(x.numel())) + out)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}".encode()
            kind = faults.classify(exc)
            if kind == faults.DEVICE:
                conn.send_bytes(b"df" + message)
                return  # the process exits: the manager replaces it
            if kind == faults.OOM:
                x = y = None
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
                conn.send_bytes(b"om" + message)
                continue
            conn.send_bytes(b"er" + message)


def _pooled(conn: Connection, threads: int, env: dict[str, str], walls: Walls | None = None) -> None:
    """A pooled worker: its unit's environment set before torch is imported (CUDA reads it once,
    when it starts), torch and its export loader warmed, then it waits for the model to load and
    serves it as a fresh worker would. While it waits it parses the programs the pool names
    (`("parse", path, keep)`, answered `("parsed", (ok, seconds or why))`), keeping the `keep`
    most recent as skeletons; a load of one of them binds only its weights (`loader.fill`)."""
    _walled(walls)
    os.environ.update(env)
    import torch

    torch.set_num_threads(threads)
    if not conn.poll(0):  # a miss already waiting for this process does not wait for the warm-up
        try:
            loader.prewarm()
        except Exception as exc:  # a warm-up that fails costs the load its first-use set-up, nothing more
            log.warning("pooled worker: prewarm failed: %s", exc)
    conn.send(("warm", None))  # the pool counts it ready (`WorkerPool.ready`)
    skeletons: OrderedDict[str, loader.Skeleton] = OrderedDict()
    while True:
        try:
            order = conn.recv()
        except (EOFError, OSError):  # the pool closed
            return
        if order[0] != "parse":
            break
        _, path, keep = order
        conn.send(("parsed", _parse(skeletons, path, keep)))
    kind, path, device = order
    skeleton = skeletons.pop(path, None)
    skeletons.clear()  # the others' memory goes before the meter's baseline
    if kind == "prepare":
        _prepared(conn, path, device, torch)
        return
    _serve(conn, path, device, threads, env, skeleton)


def _parse(skeletons: OrderedDict[str, loader.Skeleton], path: str, keep: int) -> tuple[bool, float | str]:
    """One program parsed into `skeletons` (the oldest dropped past `keep`): (True, seconds), or
    (False, why) for one that cannot be bound from its archive or does not load at all."""
    try:
        skeletons[path] = skeleton = loader.parse(path)
    except Exception as exc:  # noqa: BLE001 - any failure only means this program is loaded whole at its miss
        skeletons.pop(path, None)
        return False, f"{type(exc).__name__}: {exc}"
    skeletons.move_to_end(path)
    while len(skeletons) > max(0, keep):
        skeletons.popitem(last=False)
    return True, skeleton.parse_s


def _prepared(conn: Connection, path: str, device: str, torch) -> None:
    """A prepared worker: the artifact read and checked into host memory now (`loader.prepare`,
    no CUDA touched), then, on the miss that takes it, only the copy to the device and the
    warm-up. The meter's baseline is taken before the read, so the model's measured cost is the
    same as after a load from the store."""
    from .memory import process_uss_mb

    meter = WorkerMeter(device, torch)
    t0 = time.perf_counter()
    try:
        prepared = loader.prepare(path)
    except Exception as exc:  # an artifact that does not load: the pool drops this process
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    prepare_s = max(time.perf_counter() - t0, 1e-9)
    conn.send(("prepared", (prepare_s, process_uss_mb())))  # its host memory, for the pool's budget
    try:
        kind, load_path, load_device = conn.recv()
    except (EOFError, OSError):  # dropped from the tier (its budget, the unit gone, the pool closed)
        return
    if (load_path, load_device) != (path, device):  # not what was prepared: loaded from the store
        prepared = None
        _load_and_serve(conn, lambda: _load(load_path, load_device), load_device, torch, meter)
        return
    _load_and_serve(
        conn, lambda: loader.ready(loader.finish(prepared, device), device), device, torch, meter, prepare_s
    )


def spawn_pooled(threads: int, env: dict[str, str], walls: Walls | None = None) -> Pooled:
    """One pooled process (the `WorkerPool`'s spawn function), behind `walls` (`isolation.py`)."""
    parent, child = _CTX.Pipe()
    proc = _CTX.Process(target=_pooled, args=(child, threads, dict(env), walls), daemon=True)
    proc.start()
    child.close()
    return Pooled(proc, parent, dict(env))


class Worker:
    def __init__(
        self,
        artifact: Artifact,
        device: str = "cpu",
        threads: int = 1,
        env: dict[str, str] | None = None,
        pool: WorkerPool | None = None,
        walls: Walls | None = None,
    ):
        """pool: warm processes to take one from (a fresh one is spawned when it has none).
        walls: what a fresh process enters first (`isolation.py`); the pool's have their own."""
        self.artifact, self.device, self.threads = artifact, device, threads
        self.env = dict(env or {})  # set in the worker process before CUDA starts
        self.pool = pool
        self.walls = walls
        self.proc: mp.Process | None = None
        self.conn: Connection | None = None
        self.info: LoadedInfo | None = None
        self.peak_mb = 0.0  # the model's peak cost so far, as the worker last measured it
        self.now_mb = 0.0  # and what it holds now (cuda: torch's reserved memory)
        self._prepared_ahead_s = 0.0
        self._died_loading = False
        self._batches = Sender()  # this process's shared batch buffer (`handover`)

    def _take_pooled(self) -> bool:
        """Hand the model to a pooled process: False when the pool has none alive for this env."""
        while self.pool is not None and (pooled := self.pool.take(self.env, str(self.artifact.path))) is not None:
            try:
                pooled.conn.send(("load", str(self.artifact.path), self.device))
            except (OSError, BrokenPipeError):
                stop_pooled(pooled)
                continue
            self.proc, self.conn = pooled.proc, pooled.conn
            return True
        return False

    def _take_prepared(self, timeout_s: float) -> PreparedWorker | None:
        """The process holding this model prepared for this environment and device, if one is
        alive (one whose preparation is under way is waited for: it started before this miss)."""
        if self.pool is None:
            return None
        prepared = self.pool.take_prepared(self.artifact.digest, self.env, self.device, timeout_s)
        if prepared is None:
            return None
        self._prepared_ahead_s = max(0.0, time.monotonic() - prepared.ready_at)
        try:
            prepared.pooled.conn.send(("load", str(self.artifact.path), self.device))
        except (OSError, BrokenPipeError):  # it died since: a load from the store, as without it
            stop_pooled(prepared.pooled)
            return None
        self.proc, self.conn = prepared.pooled.proc, prepared.pooled.conn
        return prepared

    def start(self, timeout_s: float = 120) -> LoadedInfo:
        t0 = time.perf_counter()
        prepared = self._take_prepared(timeout_s)
        try:
            if self.pool is None:
                return self._start(timeout_s, t0, prepared)
            with self.pool.loading():  # no preparation starts on this node while it loads
                try:
                    return self._start(timeout_s, t0, prepared)
                except ModelLoadError:
                    if prepared is None or not self._died_loading:
                        raise
                    log.warning("model %s: its prepared worker died; loading from the store", self.artifact.digest[:12])
                    return self._start(timeout_s, time.perf_counter(), None)
        finally:
            if self.pool is not None:  # after the load: a spawn now would compete with it for the CPU
                self.pool.refill(self.env)

    def _start(self, timeout_s: float, t0: float, prepared: PreparedWorker | None = None) -> LoadedInfo:
        pooled = prepared is not None or self._take_pooled()
        if not pooled:
            parent, child = _CTX.Pipe()
            self.proc = _CTX.Process(
                target=_fresh,
                args=(child, str(self.artifact.path), self.device, self.threads, self.env, self.walls),
                daemon=True,
            )
            self.proc.start()
            child.close()
            self.conn = parent
        self._died_loading = False
        parent, deadline = self.conn, time.monotonic() + timeout_s
        kind, value = "warm", None
        while kind == "warm":  # a pooled process says when it finished warming; the load's answer follows
            if not parent.poll(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise LoadLost(f"model {self.artifact.digest[:12]} did not load within {timeout_s:.0f}s")
            try:
                kind, value = parent.recv()
            except (EOFError, OSError):
                how = self._how_it_ended()
                self.stop()
                self._died_loading = True
                raise LoadLost(f"model {self.artifact.digest[:12]}: the worker died while loading ({how})") from None
        if kind == "oom":
            self.stop()
            raise OutOfDeviceMemory(f"model {self.artifact.digest[:12]}: out of memory while loading: {value}")
        if kind == "error":
            self.stop()
            raise ModelLoadError(f"model {self.artifact.digest[:12]}: {value}")
        # spawn: what the miss cost beyond the worker's own load (interpreter and imports, or the hand-over)
        spawn_s = max(0.0, time.perf_counter() - t0 - value.load_s)
        self.info = dataclasses.replace(value, spawn_s=spawn_s, pooled=pooled)
        if prepared is not None:  # its own report says how long the read took; the pool, when it was done
            self.info = dataclasses.replace(self.info, prepared=True, prepared_ahead_s=self._prepared_ahead_s)
        self.peak_mb = self.now_mb = value.memory_mb
        return self.info

    def _how_it_ended(self) -> str:
        """The dead worker's exit, in words: a SIGKILL is most often the kernel's OOM killer."""
        if self.proc is None:
            return "no process"
        self.proc.join(2)
        code = self.proc.exitcode
        if code is None:
            return "still running, its pipe closed"
        if code == -9:
            return "killed by SIGKILL: the kernel's OOM killer when host memory runs out"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def run(self, payload: bytes, timeout_s: float = 60) -> bytes:
        """A wire-format batch in, a wire-format result out."""
        if self.conn is None or not self.alive:
            raise WorkerDied("worker is not running")
        try:
            self._batches.send(self.conn, payload)
            if not self.conn.poll(timeout_s):
                self.stop()
                raise WorkerDied(f"worker did not answer within {timeout_s:.0f}s")
            reply = self.conn.recv_bytes()
        except (EOFError, OSError, BrokenPipeError):
            self.stop()
            raise WorkerDied("worker died mid-job") from None
        tag = reply[:2]
        if tag == b"ok":
            now, peak = struct.unpack_from("<dd", reply, 2)
            self.now_mb, self.peak_mb = now, max(self.peak_mb, peak)
            return reply[18:]
        message = reply[2:].decode("utf-8", "replace")
        if tag == b"df":
            self.stop()
            raise DeviceFault(message)
        if tag == b"om":
            raise OutOfDeviceMemory(message)
        raise ModelInputError(message)

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc, self.conn)
        elif self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        self._batches.close()  # a restarted process is sent a buffer of its own on its first batch
