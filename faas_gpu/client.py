"""The GPU client of python3-gpu: the handler's models run on GPU units through the scheduler.

`install()` (called by the template's index.py before it imports the handler) swaps
`torch.load` and `torch.jit.load`: loading a whole model (TorchScript, a pickled module) returns
a `RemoteModel`; calling it sends the batch to the scheduler, which places it on a unit. State
dicts and tensors load as before.

The scheduler and the GPU Managers never take a pickle (`faas_gpu.models.safe_formats`: unpickling
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

What it says to the scheduler is the contract (`faas_gpu.contract`: headers, the SLO as a budget,
the tensor wire format, the variables' defaults); it imports no daemon.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import requests
import torch

from faas_gpu.batching import (  # noqa: F401 — names the handlers and the template use here
    BatchQueue,
    LocalBatchedModel,
    LocalBatching,
    app_timeouts,
    current_app,
    last_job,
    request_class,
)
from faas_gpu.contract import env
from faas_gpu.contract import headers as h
from faas_gpu.contract.slo import Budget
from faas_gpu.contract.wire import decode, encode

log = logging.getLogger("faas_gpu.client")
_installed = False
_original = {}
RETRYABLE = (502, 503, 504)
DEADLINE_HEADER = h.BUDGET_MS  # the budget left, in ms (the scheduler turns it into its deadline)
DEADLINE_MISSED_HEADER = h.DEADLINE_MISSED


@dataclass
class ClientConfig:
    scheduler_urls: list[str]
    token: str
    max_batch: int = env.MAX_BATCH.default
    batch_timeout_s: float = env.DEFAULT_BATCH_TIMEOUT_S
    retries: int = 50
    slo_ms: float = 0.0
    gpu_share: int = 0
    app_timeouts: dict[str, float] = field(default_factory=dict)
    default_class: str | None = None
    max_inflight: int = env.MAX_INFLIGHT.default
    model_name: str | None = None  # sent as X-Faas-Gpu-Model: FAAS_GPU_PROTEAN_MODEL, else FAAS_GPU_MODEL

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientConfig | None:
        environ = os.environ if environ is None else environ
        urls = list(env.SCHEDULER_URL.read(environ))
        if not urls:
            return None
        return cls(
            urls,
            env.TOKEN.read(environ),
            env.MAX_BATCH.read(environ),
            env.batch_timeout_s(environ),
            slo_ms=env.SLO_MS.read(environ),
            gpu_share=env.GPU_SHARE.read(environ),
            app_timeouts=app_timeouts(environ),
            default_class=env.CLASS.read(environ),
            max_inflight=env.MAX_INFLIGHT.read(environ),
            model_name=env.PROTEAN_MODEL.read(environ) or env.MODEL.read(environ),
        )


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

    def _request(self, method: str, path: str, budget: Budget | None = None, **kwargs) -> requests.Response:
        """`budget`: each attempt sends what is left of it (`X-Faas-Gpu-Deadline-Ms`), so a retry is
        not given its whole SLO again; a miss the scheduler reports is not retried."""
        headers = {"Authorization": f"Bearer {self.config.token}", **kwargs.pop("headers", {})}
        last: Exception | None = None
        for attempt in range(self.config.retries):
            for url in self.config.scheduler_urls:
                if budget is not None:
                    headers[DEADLINE_HEADER] = budget.header(time.monotonic())
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
        budget = None
        if kind == "best-effort":
            headers[h.CLASS] = "best-effort"
        elif slo_ms:  # the SLO counts from the call's arrival; a cold start's export and upload is not spent
            headers[h.CLASS] = "strict"
            budget = Budget(slo_ms + cold_s * 1000, arrived if arrived is not None else t0)
        if self.config.gpu_share:
            headers[h.SHARE] = str(self.config.gpu_share)
        if self.config.model_name:
            headers[h.MODEL] = self.config.model_name
        r = self._request("POST", f"/v1/jobs/{digest}", budget, data=encode(x), headers=headers)
        return decode(r.content), h.ours(r.headers)


def _check_sendable(artifact: bytes, what: str) -> None:
    """The managers' own checks, here: a refused artifact is the handler's error, with what to do."""
    import zipfile

    from faas_gpu.contract.errors import ArtifactError
    from faas_gpu.models.safe_formats import detect_format

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
