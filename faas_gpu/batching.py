"""The instance's batch queue: concurrent calls of one python3-gpu instance coalesced into batches.

Why its own module: it is one role of the GPU client (the other is the remote model that sends a
batch to the scheduler) and the instance's CPU path uses it alone (`LocalBatchedModel`). The
template's `index.py` sets the context variables below per request; `faas_gpu.client` re-exports
every name here, the path handlers and the template use.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from faas_gpu import tracing
from faas_gpu.contract import env
from faas_gpu.contract import headers as h

last_job: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("faas_gpu_last_job", default=None)
current_app: contextvars.ContextVar[str | None] = contextvars.ContextVar("faas_gpu_current_app", default=None)
"""The application (HarmonyBatch's request class) of the request being handled: its batch timeout."""
request_class: contextvars.ContextVar[tuple[str | None, float | None]] = contextvars.ContextVar(
    "faas_gpu_request_class", default=(None, None)
)
"""PROTEAN's class of the request being handled (X-Faas-Gpu-Class, X-Faas-Gpu-Slo-Ms): strict work
overtakes best-effort work in the scheduler's queue."""


def app_timeouts(environ: dict[str, str]) -> dict[str, float]:
    """FAAS_GPU_APP_TIMEOUTS_MS, "app=ms,app=ms": each application's batch timeout in this instance."""
    return env.APP_TIMEOUTS_MS.read(environ)


@dataclass
class LocalBatching:
    """The instance's own batch size and timeout (set per instance by the INFless autoscaler)."""

    max_batch: int
    timeout_s: float
    timeouts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LocalBatching | None:
        """None (no queue) unless the instance was given a batch size above 1: on the CPU path an
        unset FAAS_GPU_MAX_BATCH means no batching, not its GPU-path default (`contract.env`)."""
        environ = os.environ if environ is None else environ
        max_batch = env.MAX_BATCH.read(environ) if env.MAX_BATCH.is_set(environ) else 1
        if max_batch <= 1:
            return None
        return cls(max_batch, env.batch_timeout_s(environ), app_timeouts(environ))


def _held_lock() -> threading.Lock:
    """A one-shot signal cheaper than `threading.Event` (which builds a Condition and its lock and
    notifies through it): created held; the batch's thread releases it once, and the caller's
    `acquire` returns then. Made and signalled once per call on the instance's hot path (issue 20)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(slots=True)
class _Call:
    x: torch.Tensor
    deadline: float = 0.0
    cls: str | None = None
    slo_ms: float | None = None
    done: threading.Lock = field(default_factory=_held_lock)
    result: torch.Tensor | None = None
    error: BaseException | None = None
    headers: dict[str, str] = field(default_factory=dict)
    arrived: float = field(default_factory=time.monotonic)
    app: str | None = None  # HarmonyBatch's application of the request (current_app)
    trace: tracing.Carried | None = None  # the caller's span (None while tracing is off)


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
        self._run = run  # (x: Tensor, BatchClass) -> (y: Tensor, headers: dict)
        # batches sent on at once: 1 for a model run here; more for a remote one, whose queueing
        # (and class order) is the scheduler's
        self._slots = threading.Semaphore(max(1, max_inflight))
        self._parallel = max_inflight > 1
        self.max_batch = max(1, int(max_batch))
        self.timeout_s = max(0.0, float(timeout_s))
        self.timeouts = {k: max(0.0, float(v)) for k, v in (timeouts or {}).items()}
        self._pending: list[_Call] = []
        self._rows = 0  # rows in _pending
        self._first_deadline = float("inf")  # the earliest deadline in _pending
        self._cv = threading.Condition()
        self._name = name
        self._batches: queue.SimpleQueue[list[_Call]] = queue.SimpleQueue()  # to the flush threads
        self._idle = 0  # flush threads waiting for a batch, not yet promised one
        self._pool_lock = threading.Lock()
        threading.Thread(target=self._flush_loop, name=name, daemon=True).start()

    def limit(self, max_rows: int) -> None:
        """No batch of more than `max_rows` rows from now on (the model's own limit, read once its
        artifact is: `faas_gpu.models.batch_limits`); 1 runs each call alone. Never raised."""
        with self._cv:
            self.max_batch = max(1, min(self.max_batch, int(max_rows)))
            self._cv.notify()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        app = current_app.get()
        timeout = self.timeouts.get(app or "", self.timeout_s)
        call = _Call(x, time.monotonic() + timeout, *request_class.get(), app=app, trace=tracing.current())
        with self._cv:
            self._pending.append(call)
            self._rows += x.shape[0]
            # the flush loop is woken only when this call changes what it waits for (the first
            # call, a full batch, an earlier deadline), not once per call
            if len(self._pending) == 1 or self._rows >= self.max_batch or call.deadline < self._first_deadline:
                self._cv.notify()
            if call.deadline < self._first_deadline:
                self._first_deadline = call.deadline
        call.done.acquire()
        if call.error is not None:
            raise call.error
        last_job.set(call.headers)
        return call.result

    def _flush_loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending:
                    self._cv.wait()
                while self._rows < self.max_batch:
                    left = self._first_deadline - time.monotonic()
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
                self._rows -= rows
                self._first_deadline = min((c.deadline for c in self._pending), default=float("inf"))
            if self._parallel:
                self._hand_off(batch)
            else:
                self._flush(batch)

    def _hand_off(self, batch: list[_Call]) -> None:
        """The batch to a flush thread: an idle one, or a new one when none is idle (at most as
        many as batches in flight, `max_inflight`). Kept, not started per batch: a thread's start
        cost more CPU than the batch's share of the path (issue 20)."""
        with self._pool_lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # promised this batch
        self._batches.put(batch)
        if spawn:
            threading.Thread(target=self._flush_thread, name=f"{self._name}-flush", daemon=True).start()

    def _flush_thread(self) -> None:
        while True:
            self._flush(self._batches.get())
            with self._pool_lock:
                self._idle += 1

    def _flush(self, batch: list[_Call]) -> None:
        try:
            x = torch.cat([c.x for c in batch]) if len(batch) > 1 else batch[0].x
            if tracing.enabled():
                y, headers = self._traced_run(x, batch)
            else:
                y, headers = self._run(x, _batch_class(batch))
            headers = {**headers, h.BATCH: str(x.shape[0])}
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
            c.done.release()

    def _traced_run(self, x: torch.Tensor, batch: list[_Call]) -> tuple[torch.Tensor, dict[str, str]]:
        """`_run` inside the batch's span: its parent the first call's span, a link to every
        call's; each call's wait for the batch is a span of its own trace."""
        now = time.time_ns()
        for c in batch:
            tracing.record("instance.batch_wait", c.trace, c.trace.at_ns if c.trace else now, now)
        first = batch[0].trace
        with tracing.span(
            "instance.batch",
            first,
            links=[c.trace for c in batch],
            attributes={"faas_gpu.batch.rows": int(x.shape[0]), "faas_gpu.batch.calls": len(batch)},
        ):
            return self._run(x, _batch_class(batch))


class BatchClass(NamedTuple):
    """What a batch asks of the scheduler: its class, its SLO (ms) counted from `arrived`, and the
    HarmonyBatch application it counts under (the tightest call's; None when its calls have none)."""

    kind: str | None = None
    slo_ms: float | None = None
    arrived: float | None = None
    app: str | None = None


def _batch_class(batch: list[_Call]) -> BatchClass:
    """A batch is strict when any of its calls is, with the tightest of their SLOs, and (third)
    when the batch's earliest call arrived: the SLO budget is counted from there, not from now."""
    arrived = min((c.arrived for c in batch), default=None)
    first_app = next((c.app for c in batch if c.app), None)
    timed = [c for c in batch if c.cls != "best-effort" and c.slo_ms is not None]
    if any(c.cls == "strict" for c in batch) or timed:
        if not timed:
            return BatchClass("strict", None, arrived, first_app)
        tightest = min(timed, key=lambda c: c.arrived + c.slo_ms / 1000)
        return BatchClass("strict", tightest.slo_ms, tightest.arrived, tightest.app or first_app)
    if batch and all(c.cls == "best-effort" for c in batch):
        return BatchClass("best-effort", None, arrived, first_app)
    return BatchClass(None, None, arrived, first_app)


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
