"""Timing for `faas-gpu profile-colocation`: solo and co-located batch times, one process per batch.

Every copy of a model runs in its own process, as serving runs one container per instance: on a
GPU so that MPS (if its daemon is up) or time-slicing shares the device as it does in serving,
with CUDA_VISIBLE_DEVICES=<UUID> choosing the GPU or MIG slice (an NVML index is turned into its
UUID, as CUDA numbers devices fastest first, not in NVML's PCI order; where NVML cannot be asked,
CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA count as NVML does). Co-runners share the SMs only under
MPS: `co_located_times(..., env=MPSSession(...).client_env())` puts them all on one daemon.
`cpu:T` runs on this machine's CPU with T torch threads, standing in for a slice's compute where there is no GPU.

Protocol of a worker (`python -m faas_gpu.profiling.colocation_runner ...`), one JSON line each way:
it loads the model, runs the warm-up, prints {"ready": ...} and waits for "go" on stdin. The
measured one then runs one more untimed batch (its co-runners are running by then) and `repeat`
timed ones, and prints {"times_s": [...]}; a co-runner runs batches until "stop" (or EOF) and
prints {"batches": n}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

READY_TIMEOUT_S = 600.0  # loading a model onto a GPU and its warm-up


class RunnerError(RuntimeError):
    """A worker failed; the message is its last error line."""


@dataclass(frozen=True)
class Device:
    """Where a batch runs: a CUDA device by UUID (or `cuda` for the one visible) or the CPU with threads."""

    spec: str  # as given: "cpu:2", "cuda", "MIG-...", "GPU-..."
    kind: str  # "cpu" | "cuda"
    visible: str | None  # CUDA_VISIBLE_DEVICES for the worker; None: leave the environment's
    threads: int = 0  # cpu: torch threads

    @property
    def is_mig(self) -> bool:
        return bool(self.visible and self.visible.startswith("MIG-"))

    @property
    def is_whole_gpu(self) -> bool:
        """A whole GPU (not a MIG slice, not the CPU): its SMs are more than its 7g profile's on an A100."""
        return self.kind == "cuda" and not self.is_mig

    def by_uuid(self, nvml: Any | None = None) -> Device:
        """This device with an NVML index replaced by its UUID (CUDA's `N` is not NVML's `N`).

        nvml: a pynvml-like module (default: pynvml); if it cannot answer, the index stays and the
        worker's CUDA_DEVICE_ORDER=PCI_BUS_ID (worker_env) makes CUDA count in NVML's order.
        """
        if self.kind != "cuda" or not (self.visible or "").isdigit():
            return self
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            try:
                uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(int(self.visible or 0)))
            finally:
                nvml.nvmlShutdown()
        except Exception:  # no driver, no such index: keep the index, ordered by PCI bus
            return self
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return Device(self.spec, self.kind, uuid, self.threads)

    @classmethod
    def parse(cls, spec: str) -> Device:
        """`cpu:T`, `cuda`, `cuda:<UUID or index>` or a bare UUID (GPU-..., MIG-...); ValueError otherwise."""
        s = spec.strip()
        if s == "cpu" or s.startswith("cpu:"):
            _, _, t = s.partition(":")
            try:
                threads = int(t) if t else 1
            except ValueError:
                threads = 0
            if threads < 1:
                raise ValueError(f"expected cpu:THREADS with THREADS >= 1, got {spec!r}")
            return cls(s, "cpu", "", threads)
        if s == "cuda":
            return cls(s, "cuda", None)
        if s.startswith("cuda:"):
            s = s[5:]
        if s.startswith(("GPU-", "MIG-")) or s.isdigit():
            return cls(spec.strip(), "cuda", s)
        raise ValueError(f"expected cpu:THREADS, cuda, or a GPU/MIG UUID (GPU-..., MIG-...), got {spec!r}")


@dataclass(frozen=True)
class Run:
    """The measured batch's times, and the device as its worker saw it (CUDA's name of the GPU and
    its streaming multiprocessors; None on the CPU)."""

    times_s: list[float]
    device_name: str
    sms: int | None = None


@dataclass(frozen=True)
class Workload:
    """A model as `faas-gpu profile` builds it: MODULE:FACTORY, one input's shape, the batch."""

    source: str
    shape: tuple[int, ...]
    batch: int
    dtype: str = "float32"


def worker_command(
    w: Workload, device: Device, role: str, repeat: int, warmup: int, python: str = sys.executable
) -> list[str]:
    cmd = [python, "-m", "faas_gpu.profiling.colocation_runner", "--model", w.source]
    cmd += ["--input-shape", ",".join(map(str, w.shape)), "--batch", str(w.batch), "--input-dtype", w.dtype]
    cmd += ["--device", device.kind, "--threads", str(device.threads), "--role", role]
    return cmd + ["--repeat", str(repeat), "--warmup", str(warmup)]


def worker_env(device: Device, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment: its device, and `extra` (an MPS daemon's pipe and log folders)."""
    env = dict(os.environ)
    if device.kind == "cuda":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # an index counts as NVML (and nvidia-smi) count
    if device.visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = device.visible
    env.update(extra or {})
    # this package resolves as it does here, and a dotted --model from the working directory
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, os.getcwd(), env.get("PYTHONPATH", "")] if p)
    return env


class _Worker:
    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
        )
        self._err: list[str] = []
        self._drain = threading.Thread(target=self._read_err, daemon=True)
        self._drain.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line.rstrip())
            del self._err[:-20]

    def message(self, timeout_s: float) -> dict[str, Any]:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            self.kill()
            self._drain.join(5)
            last = next((e for e in reversed(self._err) if e.strip()), "")
            why = "timed out" if not box else f"exited {self.proc.wait()}"
            raise RunnerError(f"worker {why}: {last}" if last else f"worker {why}")
        return json.loads(box[0])

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def co_located_times(
    measured: Workload,
    device: Device,
    corunners: int,
    *,
    corunner: Workload | None = None,
    repeat: int = 10,
    warmup: int = 3,
    cwd: Path | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Run:
    """Batch times of `measured` on `device` beside `corunners` processes running `corunner` (default: itself).

    corunners = 0 is its solo time. All processes load and warm up first; then the co-runners start
    and the measured one runs. env: added to every worker's (an MPS daemon's client_env(), so that
    they share the SMs instead of time-slicing).
    """
    cwd = cwd or Path.cwd()
    env = worker_env(device, env)
    other = corunner or measured
    workers = [_Worker(worker_command(measured, device, "measured", repeat, warmup), env, cwd)]
    workers += [_Worker(worker_command(other, device, "corunner", 0, warmup), env, cwd) for _ in range(corunners)]
    try:
        ready = [w.message(timeout_s) for w in workers]
        for w in workers[1:]:
            w.send("go")
        workers[0].send("go")
        times = workers[0].message(timeout_s)["times_s"]
        for w in workers[1:]:
            w.send("stop")
        for w in workers[1:]:
            w.message(timeout_s)
        sms = ready[0].get("sms")
        return Run([float(t) for t in times], str(ready[0].get("device", device.spec)), int(sms) if sms else None)
    finally:
        for w in workers:
            w.kill()


# -- the worker ------------------------------------------------------------------------------------
_PROTOCOL = sys.stdout  # the model's own prints go to stderr (worker_main), not into the protocol


def _say(obj: Any) -> None:
    _PROTOCOL.write(json.dumps(obj) + "\n")
    _PROTOCOL.flush()


def worker_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="colocation_runner")
    p.add_argument("--model", required=True)
    p.add_argument("--input-shape", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--input-dtype", default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--role", choices=("measured", "corunner"), required=True)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args(argv)
    sys.stdout = sys.stderr

    import torch

    from .cli import load_model, parse_shape
    from .operators import input_maker

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = "cuda:0" if a.device == "cuda" else "cpu"
    model = load_model(a.model).to(dev).eval()
    x = input_maker(parse_shape(a.input_shape, "--input-shape"), a.input_dtype, dev)(a.batch)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def one() -> float:
        t0 = time.perf_counter()
        model(x)
        sync()
        return time.perf_counter() - t0

    with torch.inference_mode():
        for _ in range(a.warmup):
            one()
        name = torch.cuda.get_device_name(0) if a.device == "cuda" else f"cpu, {torch.get_num_threads()} thread(s)"
        sms = torch.cuda.get_device_properties(0).multi_processor_count if a.device == "cuda" else None
        _say({"ready": True, "pid": os.getpid(), "device": name, "sms": sms})
        if sys.stdin.readline().strip() != "go":
            return 1
        if a.role == "measured":
            one()
            _say({"times_s": [one() for _ in range(a.repeat)]})
            return 0
        stop = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
        n = 0
        while not stop.is_set():
            one()
            n += 1
        _say({"batches": n})
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
