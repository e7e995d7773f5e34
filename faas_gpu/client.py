"""The GPU client of python3-gpu: the handler's models run on GPU units through the scheduler.

`install()` (called by the template's index.py before it imports the handler) swaps
`torch.load`, `torch.export.load` and `torch.jit.load`: loading a whole model (a torch.export
program, TorchScript, a pickled module) returns a `RemoteModel`; calling it sends the batch to the
scheduler, which places it on a unit. State dicts and tensors load as before.

`save_model(module, example, path)` is how a helper script saves a model for a handler: a
`torch.export` program with a dynamic batch dimension, checked with the managers' rules before it
is written. A whole-module `torch.save` from a helper script names its class by the script's
module (`model.Net`), which the handler, imported as the package `function`, cannot import: such
a load fails with `NotConvertible` saying so and what to do (`explain_pickle`), in the instance
with or without a scheduler, instead of a `ModuleNotFoundError` at import.

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

Placement leases (`FAAS_GPU_LEASES`, on by default): a strict batch does not go through the
scheduler when the scheduler leases its placement. The instance asks `POST /v1/leases/<digest>`
(at most once per `LEASE_RETRY_S` while none is granted), and while the lease lasts sends its
batches to the leased unit's GPU Manager itself, over one persistent connection, with the lease
and its own token (`faas_gpu.contract.lease`). Whenever the direct path cannot take a batch (no
lease, the lease ran out or was refused, the unit is draining, the manager does not answer or
has lost the model, the SLO is spent) the batch goes through the scheduler as before, which
places, retries and answers misses; a batch the model itself refused (400) is answered as the
scheduler would have answered it.

What it says to the scheduler is the contract (`faas_gpu.contract`: headers, the SLO as a budget,
the tensor wire format, the variables' defaults); it imports no daemon.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

import requests
import torch
from requests.structures import CaseInsensitiveDict

from faas_gpu import http1, tracing
from faas_gpu.batching import (  # noqa: F401 — names the handlers and the template use here
    BatchClass,
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
from faas_gpu.contract.errors import code_of
from faas_gpu.contract.lease import RENEW_BEFORE_S, LeaseError
from faas_gpu.contract.slo import Budget
from faas_gpu.contract.wire import decode, encode
from faas_gpu.models.batch_limits import BatchLimits
from faas_gpu.saving import (  # noqa: F401 — save_model and explain_pickle: names handlers use here
    HOW_TO_SAVE,
    NotConvertible,
    check_sendable,
    explain_pickle,
    export_program,
    save_model,
    source_digest,
)

log = logging.getLogger("faas_gpu.client")
_installed = ""  # "remote" or "local" once install() ran
_original = {}
RETRYABLE = (502, 503, 504)
DEADLINE_HEADER = h.BUDGET_MS  # the budget left, in ms (the scheduler turns it into its deadline)
DEADLINE_MISSED_HEADER = h.DEADLINE_MISSED
LEASE_RETRY_S = 0.5  # with no lease granted, the scheduler is asked again after this long
LEASE_ASK_TIMEOUT_S = 5.0
DIRECT_TIMEOUT_S = 300.0  # a leased batch with no SLO: as long as the scheduler's path would wait
SCHEDULER_TIMEOUT_S = 300.0  # one request to a scheduler (its own job timeout is as long)
ANSWER_MARGIN_S = 0.5  # a strict batch gives up this long before the watchdog's timeout (less for short ones)
REPORT_AFTER_S = 1.0  # leased batches are told to the scheduler at most this long after
MAX_REPORTED = 4096  # leased batches told to the scheduler with one ask (more between two asks are not counted)
REMOTE_DEPTH = 2
"""Batches of one instance in flight at which its next calls are held to batch (with an SLO): a
unit runs one batch at a time, so a third batch would only queue at the unit, unbatched; two keep
the unit busy across the round trip. FAAS_GPU_MAX_INFLIGHT still caps the batches in flight."""


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
    leases: bool = env.LEASES.default  # ask for placement leases and send batches to the GPU Manager
    call_timeout_s: float = env.EXEC_TIMEOUT.default  # the watchdog's timeout of a call (0: none)
    batch_bound: bool = env.BATCH_BOUND.default  # queued calls batch up to the SLO's bound (`BatchBound`)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientConfig | None:
        environ = os.environ if environ is None else environ
        urls = list(env.SCHEDULER_URL.read(environ))
        if not urls:
            return None
        return cls(
            urls,
            read_token(environ),
            env.MAX_BATCH.read(environ),
            env.batch_timeout_s(environ),
            slo_ms=env.SLO_MS.read(environ),
            gpu_share=env.GPU_SHARE.read(environ),
            app_timeouts=app_timeouts(environ),
            default_class=env.CLASS.read(environ),
            max_inflight=env.MAX_INFLIGHT.read(environ),
            model_name=env.PROTEAN_MODEL.read(environ) or env.MODEL.read(environ),
            leases=env.LEASES.read(environ),
            call_timeout_s=env.EXEC_TIMEOUT.read(environ),
            batch_bound=env.BATCH_BOUND.read(environ),
        )


def read_token(environ: Mapping[str, str] | None = None) -> str:
    """The function's own token: the file FAAS_GPU_TOKEN_FILE names (the runtimes put it in the
    replica's sandbox, so the environment, which a function may show anyone, never holds it), else
    FAAS_GPU_TOKEN (an instance started by something else: a benchmark, an older stack)."""
    path = env.TOKEN_FILE.read(environ)
    if path is None:
        return env.TOKEN.read(environ)
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise RuntimeError(
            f"{env.TOKEN_FILE.name}: cannot read the function's token at {path}: {exc.strerror}"
        ) from None


class RemoteError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass(frozen=True)
class HeldLease:
    """A placement lease the scheduler granted: where to send the batches, until when (monotonic)."""

    url: str
    unit: str
    text: str
    renew_at: float
    expires: float


class RemoteModel(torch.nn.Module):
    """A model whose forward runs on a GPU unit; the local module stays as the artifact's source."""

    def __init__(self, local: torch.nn.Module, config: ClientConfig, artifact: bytes | None = None):
        super().__init__()
        self.local = local
        self.config = config
        self._artifact = artifact
        self._digest: str | None = None
        self._http = requests.Session()
        self._direct = _DirectConnections()  # the persistent connections to the leased unit's GPU Manager
        self._lease: HeldLease | None = None
        self._no_lease_until = 0.0
        self._lease_lock = threading.Lock()
        self._unreported: list[list] = []  # leased batches answered, not yet told to the scheduler
        self._report_lock = threading.Lock()
        self._report_timer: threading.Timer | None = None
        self._upload_lock = threading.Lock()
        self._refused: NotConvertible | None = None  # said once, then at once on every call
        self._looked_up = False  # the digest came from an earlier replica's upload (`_known`)
        self._queue = BatchQueue(
            self._run,
            config.max_batch,
            config.batch_timeout_s,
            name="remote-batch",
            timeouts=config.app_timeouts,
            max_inflight=config.max_inflight,
            slo_s=config.slo_ms / 1000 if config.slo_ms and config.batch_bound else None,
            depth=REMOTE_DEPTH,
        )
        self.batch: BatchLimits | None = None  # what the model accepts, once its artifact is read
        if artifact is not None:
            try:  # before the first call: the first batch already within it
                self._keep_batch(check_sendable(artifact, type(local).__name__))
            except NotConvertible:
                pass  # said at the first call, where the upload refuses it

    def _keep_batch(self, limits: BatchLimits) -> None:
        """Batches within what the model accepts (issue 43): a static batch (`torch.export.export(m,
        (x,))` gives batch 1) runs each call alone, a dynamic range stacks calls up to its maximum."""
        if limits != self.batch:
            log.info("faas-gpu: the model's batch: %s", limits.text())
        self.batch = limits
        if limits.max_rows is not None:
            self._queue.limit(limits.max_rows)

    # -- artifact ------------------------------------------------------------------------
    def _ensure_uploaded(self, example: torch.Tensor) -> str:
        if self._digest:
            return self._digest
        with self._upload_lock:  # batches run in parallel; torch.export must run once, alone
            return self._upload(example)

    def _upload(self, example: torch.Tensor) -> str:
        """The artifact's digest on the scheduler: one an earlier replica of this function uploaded
        for the same source (`_known`: no export, no upload), else exported here and uploaded."""
        if self._digest:
            return self._digest
        if self._refused is not None:
            raise self._refused
        source = self._source(example)
        known = self._known(source) if source is not None else None
        if known is not None:
            self._digest, self._looked_up = known, True
            return known
        if self._artifact is None:
            self._artifact = self._export(example)
        self._keep_batch(check_sendable(self._artifact, type(self.local).__name__))
        headers = {h.MODEL_SOURCE: source} if source is not None else {}
        r = self._request("PUT", "/v1/models", data=self._artifact, headers=headers)
        answer = r.json()
        if "batch" in answer:  # the scheduler's own reading; an older one says nothing
            self._keep_batch(BatchLimits.from_json(answer["batch"]))
        self._digest, self._looked_up = answer["digest"], False
        return self._digest

    def _source(self, example: torch.Tensor) -> str | None:
        """What the artifact is made from: the loaded file's own bytes, or the module the handler
        built (`source_digest`: its code, weights and input), as a SHA-256."""
        if self._artifact is not None:
            return hashlib.sha256(self._artifact).hexdigest()
        try:
            return source_digest(self.local, example)
        except Exception:  # noqa: BLE001 — no digest only means exporting as before
            log.debug("no source digest for %s", type(self.local).__name__, exc_info=True)
            return None

    def _known(self, source: str) -> str | None:
        """The digest this function uploaded for `source` (a replica before this one), or None: a
        scheduler that does not know it (or an older one without the route) costs one request."""
        try:
            r = self._request("GET", f"/v1/model-sources/{source}")
        except (RemoteError, requests.RequestException):
            return None
        answer = r.json() if r.headers.get("Content-Type", "").startswith("application/json") else {}
        digest = answer.get("digest") if isinstance(answer, dict) else None
        if not isinstance(digest, str):
            return None
        # the batch its program accepts, as the upload would have said (issue 43)
        self._keep_batch(BatchLimits.from_json(answer.get("batch")))
        return digest

    def _export(self, example: torch.Tensor) -> bytes:
        """The module as a torch.export program (`export_program`); NotConvertible, kept for later
        calls, when it fails."""
        try:
            return export_program(self.local, example, where="in the instance")
        except NotConvertible as exc:
            self._refused = NotConvertible(f"{exc}. A pickled module is never sent to the scheduler; {HOW_TO_SAVE}")
            log.error("%s", self._refused)
            raise self._refused from exc.__cause__

    def _request(
        self, method: str, path: str, budget: Budget | None = None, give_up_at: float | None = None, **kwargs
    ) -> requests.Response:
        """`budget`: each attempt sends what is left of it (`X-Faas-Gpu-Deadline-Ms`), so a retry is
        not given its whole SLO again; a miss the scheduler reports is not retried. Nor is a batch
        whose budget ran out while no scheduler could take it (none answering, or none the leader,
        as while etcd is down): any scheduler would answer it 504 unrun, so it is answered so here
        rather than after every retry (which, past the function's timeout, became the watchdog's
        504 with no reason). `give_up_at` (monotonic): no answer is waited for past it, the
        function's own timeout (`_give_up_at`), whatever a scheduler is doing meanwhile."""
        headers = {"Authorization": f"Bearer {self.config.token}", **kwargs.pop("headers", {})}
        last: Exception | None = None
        for attempt in range(self.config.retries):
            for url in self.config.scheduler_urls:
                now = time.monotonic()
                if budget is not None:
                    headers[DEADLINE_HEADER] = budget.header(now)
                timeout = SCHEDULER_TIMEOUT_S
                if give_up_at is not None:
                    if now >= give_up_at:
                        raise self._gave_up(budget, url, last)
                    timeout = min(timeout, give_up_at - now)
                try:
                    if tracing.enabled():  # the hop to the scheduler, our span its parent
                        with tracing.span("scheduler.request", kind="client", attributes={"http.method": method}):
                            r = self._http.request(
                                method, url + path, headers=tracing.inject(dict(headers)), timeout=timeout, **kwargs
                            )
                    else:
                        r = self._http.request(method, url + path, headers=headers, timeout=timeout, **kwargs)
                except requests.ConnectionError as exc:
                    last = exc
                    continue
                except requests.Timeout as exc:  # a scheduler took the batch and had not answered by then
                    if give_up_at is not None and time.monotonic() >= give_up_at - 0.01:
                        raise self._gave_up(budget, url, exc) from exc
                    raise
                if r.headers.get(DEADLINE_MISSED_HEADER) == "true" and r.status_code >= 300:
                    raise RemoteError(r.status_code, r.text.strip())
                if r.status_code in RETRYABLE:
                    last = RemoteError(r.status_code, r.text.strip())
                    continue
                if r.status_code >= 300:
                    raise RemoteError(r.status_code, r.text.strip())
                return r
            if budget is not None and budget.remaining_ms(time.monotonic()) <= 0:
                raise RemoteError(
                    504, f"missed its deadline ({budget.ms:.0f} ms) while no scheduler could place it: {last}"
                )
            time.sleep(min(0.05 * (attempt + 1), 0.5))
        raise RemoteError(503, f"no scheduler answered: {last}")

    def _give_up_at(self, budget: Budget | None) -> float | None:
        """When a strict batch stops waiting for its answer: just before the watchdog's timeout of
        its first call (`exec_timeout`), after which the watchdog has answered that call 504 and no
        later answer is read. A cold start may run past the SLO itself (the scheduler runs a job it
        has started), so the SLO is not the limit; the function's timeout is."""
        limit = self.config.call_timeout_s
        if budget is None or limit <= 0:
            return None
        return budget.start + limit - min(ANSWER_MARGIN_S, limit / 10)

    def _gave_up(self, budget: Budget | None, url: str, last: Exception | None) -> RemoteError:
        limit = self.config.call_timeout_s
        log.warning(
            "faas-gpu: no answer from the scheduler at %s within the function's timeout (%gs): %s", url, limit, last
        )
        spent = f"{budget.ms:.0f} ms" if budget is not None else "its SLO"
        return RemoteError(
            504,
            f"missed its deadline ({spent}): no answer from the scheduler within the function's timeout ({limit:g}s)",
        )

    # -- calls ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._queue(x)

    def _run(self, x: torch.Tensor, cls: tuple = BatchClass()) -> tuple[torch.Tensor, dict]:
        t0 = time.monotonic()
        uploaded = self._digest is not None
        digest = self._ensure_uploaded(x)
        cold_s = time.monotonic() - t0  # the model's one-time export and upload: a cold start, not queueing
        try:
            y, shown = self._send(x, cls, digest, cold_s, t0)
        except RemoteError as exc:
            if exc.status != 404 or not self._looked_up:
                raise
            # the artifact an earlier replica uploaded is gone from the scheduler: export and upload it
            log.info("faas-gpu: the model's earlier artifact %s… is gone; uploading it again", digest[:12])
            with self._upload_lock:
                if self._digest == digest:
                    self._digest, self._looked_up = None, False
            digest = self._ensure_uploaded(x)
            cold_s = time.monotonic() - t0
            y, shown = self._send(x, cls, digest, cold_s, t0)
        if not uploaded:  # this batch paid for the artifact: its answer says how long (a cold start's part)
            shown = {**shown, h.UPLOAD_SECONDS: f"{cold_s:.3f}"}
        return y, shown

    def _send(
        self, x: torch.Tensor, cls: tuple, digest: str, cold_s: float, t0: float
    ) -> tuple[torch.Tensor, dict[str, str]]:
        kind, slo_ms, arrived, app = BatchClass(*cls)
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
        if app:  # the scheduler counts the job's SLO under it
            headers[h.APP] = app
        body = encode(x)
        if self.config.leases and kind != "best-effort":
            done = self._run_leased(digest, body, headers, budget, int(x.shape[0]) if x.dim() else 1)
            if done is not None:
                return done
        r = self._request(
            "POST", f"/v1/jobs/{digest}", budget, give_up_at=self._give_up_at(budget), data=body, headers=headers
        )
        return decode(r.content), h.ours(r.headers)

    # -- placement leases: the batch straight to the leased unit's GPU Manager ---------------------
    def _run_leased(
        self, digest: str, body: bytes, headers: dict[str, str], budget: Budget | None, rows: int
    ) -> tuple[torch.Tensor, dict] | None:
        """The batch's answer from the leased unit, or None: send it through the scheduler."""
        lease = self._current_lease(digest, headers)
        if lease is None:
            return None
        if budget is not None and budget.remaining_ms(time.monotonic()) <= 0:
            return None  # spent: the scheduler answers the miss
        send = {"Authorization": f"Bearer {self.config.token}", h.LEASE: lease.text, **headers}
        if budget is not None:  # the manager does not start it past its deadline, as the scheduler would not
            send[DEADLINE_HEADER] = budget.header(time.monotonic())
        try:
            if tracing.enabled():
                with tracing.span("gpu_manager.request", kind="client", attributes={"faas_gpu.unit": lease.unit}):
                    r = self._post_direct(lease, digest, body, tracing.inject(send), budget)
            else:
                r = self._post_direct(lease, digest, body, send, budget)
        # the manager died, is unreachable, or answered no HTTP: the scheduler places the batch
        except (OSError, ValueError, http1.ProtocolError) as exc:
            log.info("faas-gpu: leased unit %s at %s failed (%s); through the scheduler", lease.unit, lease.url, exc)
            self._drop_lease(lease)
            return None
        if r.status_code == 200:
            self._ran(rows, 200, r.headers.get(h.EXECUTE_SECONDS), budget is not None, headers.get(h.APP, ""))
            self._report_soon(digest, headers)
            return decode(r.content), h.ours(r.headers)
        if r.status_code == 400 and h.UNIT_STATE not in r.headers:  # the model refused the batch, as it would there
            self._ran(rows, 400, None, False, headers.get(h.APP, ""))
            self._report_soon(digest, headers)
            raise RemoteError(r.status_code, r.text.strip())
        if r.headers.get(DEADLINE_MISSED_HEADER) == "true":  # late at the unit: not run, a miss as the scheduler's
            self._ran(rows, r.status_code, None, True, headers.get(h.APP, ""))
            self._report_soon(digest, headers)
            raise RemoteError(r.status_code, r.text.strip())
        if code_of(r.headers) != LeaseError.code:
            log.info("faas-gpu: leased unit %s answered %d; through the scheduler", lease.unit, r.status_code)
        self._drop_lease(lease)  # run out, draining, gone, model lost, manager in trouble
        return None

    def _ran(self, rows: int, status: int, exec_s: str | None, slo: bool, app: str) -> None:
        """A leased batch answered: told to the scheduler with the next lease asked for (its
        metrics count every batch, leased or not), at most `MAX_REPORTED` at a time."""
        try:
            seconds = float(exec_s or 0)
        except ValueError:
            seconds = 0.0
        with self._report_lock:
            if len(self._unreported) < MAX_REPORTED:
                self._unreported.append([rows, status, round(seconds, 6), slo, app])

    def _report_soon(self, digest: str, headers: dict[str, str]) -> None:
        """Leased batches reach the scheduler's metrics within `REPORT_AFTER_S` even when traffic
        stops (otherwise they wait for the next lease asked for, which may never come): one timer
        at a time, which asks for the lease again with the reports (a renewal, as traffic would)."""
        with self._report_lock:
            if self._report_timer is not None:
                return
            self._report_timer = timer = threading.Timer(REPORT_AFTER_S, self._flush_reports, (digest, dict(headers)))
        timer.daemon = True
        timer.start()

    def _flush_reports(self, digest: str, headers: dict[str, str]) -> None:
        with self._report_lock:
            self._report_timer = None
            if not self._unreported:
                return
        with self._lease_lock:
            lease = self._ask_lease(digest, headers)
            if lease is not None:
                self._lease = lease

    def _post_direct(
        self, lease: HeldLease, digest: str, body: bytes, headers: dict[str, str], budget: Budget | None
    ) -> DirectAnswer:
        """No longer than the call's budget (and a second): a manager whose host vanished without
        closing the connection must not hold the batch past its SLO; the scheduler answers then."""
        timeout = DIRECT_TIMEOUT_S
        if budget is not None:
            timeout = min(timeout, max(0.0, budget.remaining_ms(time.monotonic())) / 1000 + 1.0)
        return self._direct.post(
            lease.url, f"/v1/jobs/{digest}?unit={quote(lease.unit, safe='')}", body, headers, timeout
        )

    def _current_lease(self, digest: str, headers: dict[str, str]) -> HeldLease | None:
        """The lease to use now: the one held until it is due for renewal, then a new one from the
        scheduler (one batch thread asks; the others use the old one while it lasts)."""
        now = time.monotonic()
        held = self._lease
        if held is not None and now < held.renew_at:
            return held
        usable = held if held is not None and now < held.expires else None
        if now < self._no_lease_until:
            return usable
        if not self._lease_lock.acquire(blocking=usable is None):
            return usable
        try:
            if self._lease is not held:  # renewed by another thread meanwhile
                return self._lease
            self._lease = self._ask_lease(digest, headers)
            if self._lease is None:
                self._no_lease_until = time.monotonic() + LEASE_RETRY_S
            return self._lease
        finally:
            self._lease_lock.release()

    def _ask_lease(self, digest: str, headers: dict[str, str]) -> HeldLease | None:
        ask = {"Authorization": f"Bearer {self.config.token}"}
        ask.update({k: headers[k] for k in (h.CLASS, h.MODEL) if k in headers})
        with self._report_lock:
            ran, self._unreported = self._unreported, []
        for url in self.config.scheduler_urls:
            t0 = time.monotonic()
            try:
                r = self._http.post(
                    f"{url}/v1/leases/{digest}", json={"ran": ran}, headers=ask, timeout=LEASE_ASK_TIMEOUT_S
                )
            except requests.RequestException:
                continue
            if r.status_code == 503:  # not the leader
                continue
            ran = []  # told
            if r.status_code != 200:  # 204: none now; 404 on a scheduler without leases
                return None
            try:
                body = r.json()
                granted_s = float(body["expires_in_s"])
                return HeldLease(
                    str(body["url"]).rstrip("/"),
                    str(body["unit"]),
                    str(body["lease"]),
                    t0 + max(0.0, granted_s - RENEW_BEFORE_S),
                    t0 + granted_s,
                )
            except (ValueError, KeyError, TypeError):
                return None
        self._keep_unreported(ran)  # no scheduler answered
        return None

    def _keep_unreported(self, ran: list[list]) -> None:
        """Reports no scheduler took: told with the next ask."""
        if ran:
            with self._report_lock:
                self._unreported = (ran + self._unreported)[:MAX_REPORTED]

    def _drop_lease(self, lease: HeldLease) -> None:
        with self._lease_lock:
            if self._lease is lease:
                self._lease = None


class DirectAnswer:
    """A GPU Manager's answer to a leased batch, with what the client reads of a `requests`
    response (`status_code`, case-insensitive `headers`, `content`, `text`)."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, answer: http1.Answer):
        self.status_code = answer.status
        self.headers: CaseInsensitiveDict[str] = CaseInsensitiveDict(answer.headers)
        self.content = answer.body

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class _DirectConnections:
    """One kept-alive `faas_gpu.http1` connection per (batch thread, GPU Manager): the batches of
    an instance go to its leased unit over connections that stay open, without `requests`' session
    and adapter work per batch (issue 20: ~20% of an instance's CPU at batch 8). A connection the
    manager closed while it idled is found before use and reopened; any other failure closes it
    and is raised (`OSError`, `http1.ProtocolError`), and the caller sends the batch through the
    scheduler."""

    KEPT = 4
    """Managers a thread keeps a connection to (a lease moves between a few units)."""

    def __init__(self) -> None:
        self._kept = http1.ThreadConnections(self.KEPT)

    def post(self, base_url: str, target: str, body: bytes, headers: dict[str, str], timeout: float) -> DirectAnswer:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise http1.ProtocolError(f"{base_url}: only http:// managers are reached directly")
        conn, _ = self._kept.get(base_url, timeout)
        try:
            conn.settimeout(timeout)
            answer = conn.request("POST", parts.path.rstrip("/") + target, headers, body)  # connects when new
        except BaseException:
            self._kept.forget(base_url, conn)
            raise
        if answer.will_close:
            self._kept.forget(base_url, conn)
        return DirectAnswer(answer)


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
    """Swap torch.load / torch.export.load / torch.jit.load for remote-model loaders; False when
    running locally, where only torch.load is wrapped, to explain a whole-module pickle's failure."""
    global _installed
    config = _config()
    if _installed == ("remote" if config else "local"):
        return config is not None
    uninstall()  # installed the other way (a scheduler set since): start again
    _original["load"], _original["jit_load"] = torch.load, torch.jit.load
    _original["export_load"] = torch.export.load
    if config is None:
        log.warning("faas-gpu: no scheduler configured (FAAS_GPU_SCHEDULER_URL); models run locally on the CPU")
        torch.load = _explaining_load
        _installed = "local"
        return False

    def load(f, *args, **kwargs):
        obj = _explaining_load(f, *args, **kwargs)
        if isinstance(obj, torch.nn.Module):
            return RemoteModel(obj.eval(), config)
        return obj

    def jit_load(f, *args, **kwargs):
        data = _read(f)
        module = _jit_load_quietly(io.BytesIO(data) if data is not None else f, *args, **kwargs)
        return RemoteModel(module, config, artifact=data)

    def export_load(f, *args, **kwargs):
        data = _read(f)
        program = _original["export_load"](io.BytesIO(data) if data is not None else f, *args, **kwargs)
        return _RemoteProgram(program, RemoteModel(program.module(), config, artifact=data))

    torch.load, torch.jit.load, torch.export.load = load, jit_load, export_load
    _installed = "remote"
    log.info(
        "faas-gpu: models loaded with torch.export.load / torch.load / torch.jit.load run through %s",
        config.scheduler_urls[0],
    )
    return True


def _explaining_load(f, *args, **kwargs):
    """torch.load; a whole-module pickle it cannot load (its class's module is not importable
    here, or weights_only refuses it) is NotConvertible saying what to do, not torch's error."""
    by_path = isinstance(f, str | os.PathLike)  # torch opens it (mmap=True works); read again only to explain
    data = None if by_path else _read(f)
    try:
        return _original["load"](f if by_path or data is None else io.BytesIO(data), *args, **kwargs)
    except Exception as exc:
        try:
            data = _read(f) if by_path else data
        except OSError:
            data = None
        message = explain_pickle(data, _name(f)) if data is not None else None
        if message is None:
            raise
        raise NotConvertible(f"{message} (torch.load said: {type(exc).__name__}: {_first_line(exc)})") from exc


_said_torchscript = False


def _jit_load_quietly(f, *args, **kwargs):
    """torch.jit.load without torch's DeprecationWarning (the user chose TorchScript; it runs), said
    once in the log with the way forward."""
    global _said_torchscript
    if not _said_torchscript:
        _said_torchscript = True
        log.warning(
            "faas-gpu: this model is TorchScript, which torch deprecates; it still runs on the GPU path. To move "
            "on, save it with faas_gpu.save_model(model, example_input, 'model.pt2') and torch.export.load it"
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
        return _original["jit_load"](f, *args, **kwargs)


def _name(f) -> str:
    return Path(f).name if isinstance(f, str | os.PathLike) else "the model file"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


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
        _installed = ""
