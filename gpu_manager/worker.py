"""A model worker: one process per (model, unit), as in the GPU-FaaS paper's GPU Manager.

The process loads the artifact on its device once (TorchScript or a `torch.export` program,
never a pickle: `safe_formats` says why these are safe and checks the file again here, whatever
the store on disk holds) and then runs batches sent over a pipe as wire-format tensors. Loading
and running user models happens here, never in the manager, so a model that crashes or hangs
takes down only its worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from faas_gpu.models import Artifact
from faas_gpu.procs import die_with_parent

from . import faults
from .memory import WorkerMeter

_CTX = mp.get_context("spawn")  # no fork of a threaded manager; CUDA needs spawn anyway


class WorkerError(Exception):
    pass


class ModelLoadError(WorkerError):
    """The artifact would not load on this device."""


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
    param_bytes: int
    load_s: float
    memory_mb: float = 0.0  # the model's cost after the load: cpu USS growth, cuda torch-reserved (no context)
    process_mb: float = 0.0  # the worker before any model (interpreter and torch; host memory)


def _load(path: str, device: str):
    """Checked before torch opens it (the format comes from the file, not from the caller), and
    the loaded graphs checked before the first call; no `weights_only=False` path exists here."""
    import zipfile

    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # any torch.load inside torch's own loaders
    import torch

    from faas_gpu.models import safe_formats

    with zipfile.ZipFile(path) as z:
        fmt = safe_formats.detect_format(z)  # ArtifactError for a pickle or anything unsafe
    if fmt == "torchscript":  # an old artifact its owner chose: torch's deprecation is theirs, not this log's
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
            model = torch.jit.load(path, map_location=device)
        safe_formats.check_torchscript(model)
        model.eval()
    else:
        with open(path, "rb") as fh:  # check_guards=False: torch would exec guard code built from the file
            model = torch.export.load(fh).module(check_guards=False)
        safe_formats.check_graph(model)
        model = model.to(device)
    return model


def _serve(conn: Connection, path: str, device: str, threads: int, env: dict[str, str]) -> None:
    die_with_parent(parent_pid=mp.parent_process().pid)  # a killed manager leaves no worker behind
    os.environ.update(env)  # CUDA_VISIBLE_DEVICES, MPS pipes and share: read when CUDA starts, below
    import torch

    torch.set_num_threads(threads)
    meter = WorkerMeter(device, torch)  # the baseline before the model: its cost is the growth
    t0 = time.perf_counter()
    try:
        model = _load(path, device)
        tensors = list(model.parameters()) + list(model.buffers()) if hasattr(model, "parameters") else []
        size = sum(t.numel() * t.element_size() for t in tensors)
    except Exception as exc:  # reported to the manager, which answers the caller (MemoryError too)
        kind = "oom" if faults.classify(exc) == faults.OOM else "error"
        conn.send((kind, f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", LoadedInfo(size, time.perf_counter() - t0, meter.cost_mb()[1], meter.process_mb)))
    _serve_batches(conn, model, device, torch, meter)


def _serve_batches(conn: Connection, model, device: str, torch, meter) -> None:
    """Batches until the pipe closes. Each answer carries the model's peak cost so far (its
    activations grow with the batch) and what it holds now. An input error answers `er` and serves on; out of memory
    answers `om` (the allocator's cache emptied first); a device fault answers `df` and ends the
    process, since its CUDA context is lost for good."""
    from faas_gpu.contract.wire import decode, encode

    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            x = decode(payload).to(device)
            with torch.inference_mode():
                y = model(x)
            if isinstance(y, tuple | list):
                y = y[0]
            out = encode(y)
            conn.send_bytes(b"ok" + struct.pack("<dd", *meter.cost_mb()) + out)
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


class Worker:
    def __init__(self, artifact: Artifact, device: str = "cpu", threads: int = 1, env: dict[str, str] | None = None):
        self.artifact, self.device, self.threads = artifact, device, threads
        self.env = dict(env or {})  # set in the worker process before CUDA starts
        self.proc: mp.Process | None = None
        self.conn: Connection | None = None
        self.info: LoadedInfo | None = None
        self.peak_mb = 0.0  # the model's peak cost so far, as the worker last measured it
        self.now_mb = 0.0  # and what it holds now (cuda: torch's reserved memory)

    def start(self, timeout_s: float = 120) -> LoadedInfo:
        parent, child = _CTX.Pipe()
        self.proc = _CTX.Process(
            target=_serve,
            args=(child, str(self.artifact.path), self.device, self.threads, self.env),
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(timeout_s):
            self.stop()
            raise ModelLoadError(f"model {self.artifact.digest[:12]} did not load within {timeout_s:.0f}s")
        try:
            kind, value = parent.recv()
        except (EOFError, OSError):
            self.stop()
            raise ModelLoadError(f"model {self.artifact.digest[:12]}: the worker died while loading") from None
        if kind == "oom":
            self.stop()
            raise OutOfDeviceMemory(f"model {self.artifact.digest[:12]}: out of memory while loading: {value}")
        if kind == "error":
            self.stop()
            raise ModelLoadError(f"model {self.artifact.digest[:12]}: {value}")
        self.info = value
        self.peak_mb = self.now_mb = value.memory_mb
        return value

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def run(self, payload: bytes, timeout_s: float = 60) -> bytes:
        """A wire-format batch in, a wire-format result out."""
        if self.conn is None or not self.alive:
            raise WorkerDied("worker is not running")
        try:
            self.conn.send_bytes(payload)
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
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(5)
                if self.proc.is_alive():
                    self.proc.kill()
                    self.proc.join()
            self.proc = None
