"""The GPU client of python3-gpu: the handler's models run on GPU units through the scheduler.

`install()` (called by the template's index.py before it imports the handler) swaps
`torch.load` and `torch.jit.load`: loading a whole model (TorchScript, a pickled module) returns
a `RemoteModel`; calling it sends the batch to the scheduler, which places it on a unit. State
dicts and tensors load as before.

The scheduler and the GPU Managers never take a pickle (`gpu_manager.safe_formats`: unpickling
runs code, and the managers load models as root). A pickled module is converted here, in the
instance, where the user's own code already runs: `torch.export` on its first call, with a
dynamic batch dimension. One that cannot be exported fails the handler with `NotConvertible`,
which says what to ship instead; the bytes sent are checked with the managers' own rules first.

`faas_gpu.remote(module)` does the same for a module built in code. Without
`FAAS_GPU_SCHEDULER_URL` nothing is swapped: the model runs in the instance on the CPU
(`remote()` then puts it behind the instance's batch queue when the instance's batch size is
above 1), and the log says so once. The handler's code is the same either way.

Concurrent calls in one instance are coalesced into one batch (`FAAS_GPU_MAX_BATCH`, and a
timeout `FAAS_GPU_BATCH_TIMEOUT_MS`, by default a quarter of the SLO `FAAS_GPU_SLO_MS`).
"""

from __future__ import annotations

import contextvars
import io
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import requests
import torch

from gpu_manager.wire import decode, encode

log = logging.getLogger("faas_gpu.client")
_installed = False
_original = {}
last_job: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("faas_gpu_last_job", default=None)
current_app: contextvars.ContextVar[str | None] = contextvars.ContextVar("faas_gpu_current_app", default=None)
"""The application (HarmonyBatch's request class) of the request being handled: its batch timeout."""
request_class: contextvars.ContextVar[tuple[str | None, float | None]] = contextvars.ContextVar(
    "faas_gpu_request_class", default=(None, None)
)
"""PROTEAN's class of the request being handled (X-Faas-Gpu-Class, X-Faas-Gpu-Slo-Ms): strict work
overtakes best-effort work in the scheduler's queue."""
RETRYABLE = (502, 503, 504)
DEADLINE_HEADER = "X-Faas-Gpu-Deadline-Ms"  # the budget left, in ms (scheduler.api reads it)
DEADLINE_MISSED_HEADER = "X-Faas-Gpu-Deadline-Missed"


def _batch_timeout_s(env) -> float:
    """FAAS_GPU_BATCH_TIMEOUT_MS, else a quarter of the SLO, else 5 ms."""
    timeout_ms = env.get("FAAS_GPU_BATCH_TIMEOUT_MS")
    slo_ms = float(env.get("FAAS_GPU_SLO_MS", "0") or 0)
    return float(timeout_ms) / 1000 if timeout_ms else (slo_ms / 4000 if slo_ms else 0.005)


def app_timeouts(env) -> dict[str, float]:
    """FAAS_GPU_APP_TIMEOUTS_MS, "app=ms,app=ms": each application's batch timeout in this instance."""
    out: dict[str, float] = {}
    for item in (env.get("FAAS_GPU_APP_TIMEOUTS_MS") or "").split(","):
        name, _, ms = item.partition("=")
        if name.strip() and ms.strip():
            out[name.strip()] = float(ms) / 1000
    return out


@dataclass
class LocalBatching:
    """The instance's own batch size and timeout (set per instance by the INFless autoscaler)."""

    max_batch: int
    timeout_s: float
    timeouts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> LocalBatching | None:
        env = os.environ if env is None else env
        max_batch = int(env.get("FAAS_GPU_MAX_BATCH", "1") or 1)
        if max_batch <= 1:
            return None
        return cls(max_batch, _batch_timeout_s(env), app_timeouts(env))


@dataclass
class ClientConfig:
    scheduler_urls: list[str]
    token: str
    max_batch: int = 8
    batch_timeout_s: float = 0.005
    retries: int = 50
    slo_ms: float = 0.0
    gpu_share: int = 0
    app_timeouts: dict[str, float] = field(default_factory=dict)
    default_class: str | None = None
    max_inflight: int = 32
    model_name: str | None = None  # sent as X-Faas-Gpu-Model: FAAS_GPU_PROTEAN_MODEL, else FAAS_GPU_MODEL

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ClientConfig | None:
        env = os.environ if env is None else env
        urls = [u.strip().rstrip("/") for u in env.get("FAAS_GPU_SCHEDULER_URL", "").split(",") if u.strip()]
        if not urls:
            return None
        slo_ms = float(env.get("FAAS_GPU_SLO_MS", "0") or 0)
        timeout_s = _batch_timeout_s(env)
        return cls(
            urls,
            env.get("FAAS_GPU_TOKEN", ""),
            int(env.get("FAAS_GPU_MAX_BATCH", "8")),
            timeout_s,
            slo_ms=slo_ms,
            gpu_share=int(env.get("FAAS_GPU_GPU_SHARE", "0") or 0),
            app_timeouts=app_timeouts(env),
            default_class=env.get("FAAS_GPU_CLASS") or None,
            max_inflight=int(env.get("FAAS_GPU_MAX_INFLIGHT", "32") or 32),
            model_name=(env.get("FAAS_GPU_PROTEAN_MODEL") or env.get("FAAS_GPU_MODEL") or "").strip() or None,
        )


@dataclass
class _Call:
    x: torch.Tensor
    deadline: float = 0.0
    cls: str | None = None
    slo_ms: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: torch.Tensor | None = None
    error: BaseException | None = None
    headers: dict[str, str] = field(default_factory=dict)
    arrived: float = field(default_factory=time.monotonic)


class BatchQueue:
    """The instance's batch queue: concurrent calls wait until `max_batch` rows are queued or one
    of them has waited its timeout, then run as one batch. INFless's built-in batching gives the
    instance one timeout (t_slo - t_exec); HarmonyBatch's groups give each application its own
    (`timeouts`, by `current_app`), so a tight-SLO app does not wait as long as a loose one."""

    def __init__(
        self,
        run,
        max_batch: int,
        timeout_s: float,
        name: str = "batch-queue",
        timeouts: dict[str, float] | None = None,
        max_inflight: int = 1,
    ):
        self._run = run  # (x: Tensor, (class, slo_ms)) -> (y: Tensor, headers: dict)
        # batches sent on at once: 1 for a model run here; more for a remote one, whose queueing
        # (and class order) is the scheduler's
        self._slots = threading.Semaphore(max(1, max_inflight))
        self._parallel = max_inflight > 1
        self.max_batch = max(1, int(max_batch))
        self.timeout_s = max(0.0, float(timeout_s))
        self.timeouts = {k: max(0.0, float(v)) for k, v in (timeouts or {}).items()}
        self._pending: list[_Call] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._flush_loop, name=name, daemon=True).start()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        timeout = self.timeouts.get(current_app.get() or "", self.timeout_s)
        call = _Call(x, time.monotonic() + timeout, *request_class.get())
        with self._cv:
            self._pending.append(call)
            self._cv.notify()
        call.done.wait()
        if call.error is not None:
            raise call.error
        last_job.set(call.headers)
        return call.result

    def _flush_loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending:
                    self._cv.wait()
                while sum(c.x.shape[0] for c in self._pending) < self.max_batch:
                    left = min(c.deadline for c in self._pending) - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
            self._slots.acquire()  # the batch is formed once it can go: calls that came meanwhile count
            with self._cv:
                # strict (or unclassed) calls first, best-effort ones behind, each in arrival order:
                # the scheduler's class order would be lost if batches queued here in FIFO
                self._pending.sort(key=lambda c: c.cls == "best-effort")
                batch, rows = [], 0
                while self._pending and (not batch or rows + self._pending[0].x.shape[0] <= self.max_batch):
                    call = self._pending.pop(0)
                    batch.append(call)
                    rows += call.x.shape[0]
            if self._parallel:
                threading.Thread(target=self._flush, args=(batch,), daemon=True).start()
            else:
                self._flush(batch)

    def _flush(self, batch: list[_Call]) -> None:
        try:
            x = torch.cat([c.x for c in batch]) if len(batch) > 1 else batch[0].x
            y, headers = self._run(x, _batch_class(batch))
            headers = {**headers, "X-Faas-Gpu-Batch": str(x.shape[0])}
            start = 0
            for c in batch:
                n = c.x.shape[0]
                c.result, c.headers = y[start : start + n], headers
                start += n
        except BaseException as exc:  # every caller of the batch gets the error
            for c in batch:
                c.error = exc
        finally:
            self._slots.release()
        for c in batch:
            c.done.set()


def _batch_class(batch: list[_Call]) -> tuple[str | None, float | None, float | None]:
    """A batch is strict when any of its calls is, with the tightest of their SLOs, and (third)
    when the batch's earliest call arrived: the SLO budget is counted from there, not from now."""
    arrived = min((c.arrived for c in batch), default=None)
    timed = [c for c in batch if c.cls != "best-effort" and c.slo_ms is not None]
    if any(c.cls == "strict" for c in batch) or timed:
        if not timed:
            return "strict", None, arrived
        tightest = min(timed, key=lambda c: c.arrived + c.slo_ms / 1000)
        return "strict", tightest.slo_ms, tightest.arrived
    if batch and all(c.cls == "best-effort" for c in batch):
        return "best-effort", None, arrived
    return None, None, arrived


class LocalBatchedModel(torch.nn.Module):
    """A model run in this instance on the CPU, through the instance's batch queue."""

    def __init__(self, local: torch.nn.Module, max_batch: int, timeout_s: float, timeouts=None):
        super().__init__()
        self.local = local
        self._queue = BatchQueue(self._run, max_batch, timeout_s, name="local-batch", timeouts=timeouts)

    def _run(self, x: torch.Tensor, _cls=None) -> tuple[torch.Tensor, dict[str, str]]:
        with torch.inference_mode():
            return self.local(x), {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._queue(x)


class RemoteError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


HOW_TO_SAVE = (
    "save the model with torch.export (torch.export.export(model, (example,), dynamic_shapes="
    "({0: torch.export.Dim('batch')},)) then torch.export.save, and torch.export.load it in the handler), "
    "or ship a state dict or safetensors, build the module in the handler and call faas_gpu.remote(module), "
    "or save it as TorchScript (torch.jit.save(torch.jit.script(model)))"
)


class NotConvertible(RuntimeError):
    """A whole model loaded in the handler that cannot become an artifact the GPU path accepts."""


class RemoteModel(torch.nn.Module):
    """A model whose forward runs on a GPU unit; the local module stays as the artifact's source."""

    def __init__(self, local: torch.nn.Module, config: ClientConfig, artifact: bytes | None = None):
        super().__init__()
        self.local = local
        self.config = config
        self._artifact = artifact
        self._digest: str | None = None
        self._http = requests.Session()
        self._upload_lock = threading.Lock()
        self._refused: NotConvertible | None = None  # said once, then at once on every call
        self._queue = BatchQueue(
            self._run,
            config.max_batch,
            config.batch_timeout_s,
            name="remote-batch",
            timeouts=config.app_timeouts,
            max_inflight=config.max_inflight,
        )

    # -- artifact ------------------------------------------------------------------------
    def _ensure_uploaded(self, example: torch.Tensor) -> str:
        if self._digest:
            return self._digest
        with self._upload_lock:  # batches run in parallel; torch.export must run once, alone
            return self._upload(example)

    def _upload(self, example: torch.Tensor) -> str:
        if self._digest:
            return self._digest
        if self._refused is not None:
            raise self._refused
        if self._artifact is None:
            self._artifact = self._export(example)
        _check_sendable(self._artifact, type(self.local).__name__)
        r = self._request("PUT", "/v1/models", data=self._artifact)
        self._digest = r.json()["digest"]
        return self._digest

    def _export(self, example: torch.Tensor) -> bytes:
        """The module as a torch.export program, traced at batch 2 with a named batch dimension
        (batch 1 would be specialised away); NotConvertible, kept for later calls, when it fails."""
        buf = io.BytesIO()
        ex = example[:1].expand(2, *example.shape[1:]).clone()
        batch = torch.export.Dim("batch", min=1, max=4096)
        try:
            program = torch.export.export(self.local, (ex,), dynamic_shapes=({0: batch},))
            torch.export.save(program, buf)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            self._refused = NotConvertible(
                f"faas-gpu: the model ({type(self.local).__name__}) cannot run on the GPU path: torch.export "
                f"could not convert it in the instance ({type(exc).__name__}: {first}). A pickled module is never "
                f"sent to the scheduler; {HOW_TO_SAVE}"
            )
            log.error("%s", self._refused)
            raise self._refused from exc
        return buf.getvalue()

    def _request(self, method: str, path: str, deadline: float | None = None, **kwargs) -> requests.Response:
        """`deadline` (monotonic): each attempt sends the budget left (`X-Faas-Gpu-Deadline-Ms`), so a
        retry is not given its whole SLO again; a miss the scheduler reports is not retried."""
        headers = {"Authorization": f"Bearer {self.config.token}", **kwargs.pop("headers", {})}
        last: Exception | None = None
        for attempt in range(self.config.retries):
            for url in self.config.scheduler_urls:
                if deadline is not None:
                    headers[DEADLINE_HEADER] = f"{max(0.0, (deadline - time.monotonic()) * 1000):.3f}"
                try:
                    r = self._http.request(method, url + path, headers=headers, timeout=300, **kwargs)
                except requests.ConnectionError as exc:
                    last = exc
                    continue
                if r.headers.get(DEADLINE_MISSED_HEADER) == "true" and r.status_code >= 300:
                    raise RemoteError(r.status_code, r.text.strip())
                if r.status_code in RETRYABLE:
                    last = RemoteError(r.status_code, r.text.strip())
                    continue
                if r.status_code >= 300:
                    raise RemoteError(r.status_code, r.text.strip())
                return r
            time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise RemoteError(503, f"no scheduler answered: {last}")

    # -- calls ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._queue(x)

    def _run(
        self, x: torch.Tensor, cls: tuple[str | None, float | None, float | None] = (None, None, None)
    ) -> tuple[torch.Tensor, dict]:
        t0 = time.monotonic()
        digest = self._ensure_uploaded(x)
        cold_s = time.monotonic() - t0  # the model's one-time export and upload: a cold start, not queueing
        kind, slo_ms, arrived = cls
        kind = kind or self.config.default_class
        slo_ms = slo_ms or self.config.slo_ms
        headers = {}
        deadline = None
        if kind == "best-effort":
            headers["X-Faas-Gpu-Class"] = "best-effort"
        elif slo_ms:
            headers["X-Faas-Gpu-Class"] = "strict"
            deadline = (arrived if arrived is not None else t0) + cold_s + slo_ms / 1000
        if self.config.gpu_share:
            headers["X-Faas-Gpu-Share"] = str(self.config.gpu_share)
        if self.config.model_name:
            headers["X-Faas-Gpu-Model"] = self.config.model_name
        r = self._request("POST", f"/v1/jobs/{digest}", deadline, data=encode(x), headers=headers)
        return decode(r.content), {k: v for k, v in r.headers.items() if k.startswith("X-Faas-Gpu-")}


def _check_sendable(artifact: bytes, what: str) -> None:
    """The managers' own checks, here: a refused artifact is the handler's error, with what to do."""
    import zipfile

    from gpu_manager.safe_formats import ArtifactError, detect_format

    try:
        with zipfile.ZipFile(io.BytesIO(artifact)) as z:
            detect_format(z)
    except (ArtifactError, zipfile.BadZipFile) as exc:
        raise NotConvertible(
            f"faas-gpu: the model ({what}) cannot be sent to the GPU path: {exc}; {HOW_TO_SAVE}"
        ) from None


def _config() -> ClientConfig | None:
    return ClientConfig.from_env()


def remote(module: torch.nn.Module) -> torch.nn.Module:
    """The module, made remote when a scheduler is configured; else run here, through the
    instance's batch queue when the instance has a batch size above 1."""
    config = _config()
    if config:
        return RemoteModel(module.eval(), config)
    local = LocalBatching.from_env()
    return LocalBatchedModel(module.eval(), local.max_batch, local.timeout_s, local.timeouts) if local else module


def install() -> bool:
    """Swap torch.load / torch.jit.load for remote-model loaders; False when running locally."""
    global _installed
    config = _config()
    if config is None:
        log.warning("faas-gpu: no scheduler configured (FAAS_GPU_SCHEDULER_URL); models run locally on the CPU")
        return False
    if _installed:
        return True
    _original["load"], _original["jit_load"] = torch.load, torch.jit.load
    _original["export_load"] = torch.export.load

    def load(f, *args, **kwargs):
        data = _read(f)
        obj = _original["load"](io.BytesIO(data) if data is not None else f, *args, **kwargs)
        if isinstance(obj, torch.nn.Module):
            return RemoteModel(obj.eval(), config)
        return obj

    def jit_load(f, *args, **kwargs):
        data = _read(f)
        module = _original["jit_load"](io.BytesIO(data) if data is not None else f, *args, **kwargs)
        return RemoteModel(module, config, artifact=data)

    def export_load(f, *args, **kwargs):
        data = _read(f)
        program = _original["export_load"](io.BytesIO(data) if data is not None else f, *args, **kwargs)
        return _RemoteProgram(program, RemoteModel(program.module(), config, artifact=data))

    torch.load, torch.jit.load, torch.export.load = load, jit_load, export_load
    _installed = True
    log.info("faas-gpu: models loaded with torch.load / torch.jit.load run through %s", config.scheduler_urls[0])
    return True


class _RemoteProgram:
    """What torch.export.load returns, whose `.module()` is the remote model."""

    def __init__(self, program, remote: RemoteModel):
        self._program, self._remote = program, remote

    def module(self) -> RemoteModel:
        return self._remote

    def __getattr__(self, name):
        return getattr(self._program, name)


def _read(f) -> bytes | None:
    if isinstance(f, str | os.PathLike):
        with open(f, "rb") as fh:
            return fh.read()
    if hasattr(f, "read"):
        return f.read()
    return None


def uninstall() -> None:
    """Restore torch's loaders (for tests, and for a handler that wants them back)."""
    global _installed
    if _installed:
        torch.load, torch.jit.load = _original["load"], _original["jit_load"]
        torch.export.load = _original["export_load"]
        _installed = False
