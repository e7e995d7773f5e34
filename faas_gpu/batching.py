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
    """The instance's own batch size and timeout (set per instance by the INFless autoscaler).

    No `BatchBound` here: on the instance's CPU path a batch-1 plan runs its calls in parallel on
    the request threads, and holding them for a batch serialises them; for a model whose small
    batches cost more than their rows apart (a deep MLP at batch 2-5 took 1-1.5 s against 0.15 s
    at batch 1 here: the weights repacked per call), that served 6 calls/s against 9 in parallel.
    The bound is the GPU path's, where a unit runs one batch at a time anyway."""

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


BOUND_CAP = 64
"""The most rows a batch takes from the queue however fast the model measures (an instance's
request threads, `contract.env.instance_threads`, hold as many calls)."""
BOUND_SAMPLES = 16
"""Batch sizes whose measured times `BatchBound` keeps (the most recently seen)."""


class BatchBound:
    """How many queued rows one batch may take: the largest batch whose measured time fits half
    the SLO, never below the planned batch size.

    Why: the autoscaler plans each instance's batch size from the load it has seen; a step of load
    it has not seen (idle to 32 callers) queues calls in front of an instance planned at batch 1,
    and until the plan follows they wait one batch of one at a time and miss their deadlines.
    Triton's dynamic batcher and Ray Serve's `@serve.batch` take whatever is queued, up to their
    maximum, when the model is free; here the maximum is what the SLO allows on this instance:
    INFless's own rule t_exec <= t_slo / 2 (a call that waits out one batch and runs in the next
    still meets its SLO), on the batch times the instance measures. Times are fitted as
    fixed + per-row x rows over the sizes seen (one size seen: per-row only, which overstates a
    larger batch's time, so the bound errs small); none seen: the planned size."""

    def __init__(self, slo_s: float, floor: int, cap: int = BOUND_CAP, alpha: float = 0.3):
        self.budget_s = slo_s / 2
        self.floor = max(1, int(floor))
        self.cap = max(self.floor, int(cap))
        self.alpha = alpha
        self._seen: dict[int, float] = {}  # rows -> smoothed seconds (insertion order: least recent first)
        self._limit = self.floor

    def observe(self, rows: int, seconds: float) -> None:
        """A batch of `rows` took `seconds` (its own time: without a one-time upload or model load)."""
        if rows < 1 or seconds <= 0:
            return
        prior = self._seen.pop(rows, None)
        self._seen[rows] = seconds if prior is None else prior + self.alpha * (seconds - prior)
        while len(self._seen) > BOUND_SAMPLES:
            del self._seen[next(iter(self._seen))]
        self._limit = self._fit()

    def limit(self) -> int:
        return self._limit

    def _fit(self) -> int:
        points = list(self._seen.items())
        if len(points) == 1:
            (b, t), fixed = points[0], 0.0
            per_row = t / b
        else:
            n = len(points)
            mb = sum(b for b, _ in points) / n
            mt = sum(t for _, t in points) / n
            var = sum((b - mb) ** 2 for b, _ in points)
            per_row = sum((b - mb) * (t - mt) for b, t in points) / var
            fixed = mt - per_row * mb
            if per_row <= 0 or fixed < 0:  # noise: the slowest row rate seen, through the origin
                fixed, per_row = 0.0, max(t / b for b, t in points)
        if per_row <= 0:
            return self.floor
        return max(self.floor, min(self.cap, int((self.budget_s - fixed) / per_row)))


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
    (`timeouts`, by `current_app`), so a tight-SLO app does not wait as long as a loose one.

    With an SLO (`slo_s`) the queue also batches what the plan did not foresee: at most `depth`
    batches are in flight, calls that arrive meanwhile queue, and the next batch takes all of them
    up to `BatchBound`'s limit (the largest batch whose measured time fits half the SLO), without
    waiting for more. A load the autoscaler has not planned for is batched from its first seconds."""

    def __init__(
        self,
        run,
        max_batch: int,
        timeout_s: float,
        name: str = "batch-queue",
        timeouts: dict[str, float] | None = None,
        max_inflight: int = 1,
        slo_s: float | None = None,
        depth: int | None = None,
        clock=time.monotonic,
    ):
        """`clock` times the batches for the bound (the tests' own)."""
        self._run = run  # (x: Tensor, BatchClass) -> (y: Tensor, headers: dict)
        self._clock = clock
        # batches sent on at once: 1 for a model run here; more for a remote one, whose queueing
        # (and class order) is the scheduler's
        self._slots = threading.Semaphore(max(1, max_inflight))
        self._parallel = max_inflight > 1
        self.max_batch = max(1, int(max_batch))
        self.bound = BatchBound(slo_s, self.max_batch) if slo_s else None
        # batches in flight at which calls are held to batch (none without an SLO: the slots alone)
        self.depth = max(1, min(depth or max_inflight, max_inflight)) if self.bound is not None else max_inflight
        self._busy = 0  # batches formed and not yet answered
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
                self._cv.notify()  # (while batches are held, a call beyond max_batch may reach the bound)
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
                # busy downstream: calls that come meanwhile join this batch, up to the SLO's bound
                # (more batches in flight would only queue unbatched where they run, and their
                # times, which the bound is fitted on, would count that queue)
                while self._busy >= self.depth:
                    self._cv.wait()
            self._slots.acquire()  # the batch is formed once it can go: calls that came meanwhile count
            with self._cv:
                # strict (or unclassed) calls first, best-effort ones behind, each in arrival order:
                # the scheduler's class order would be lost if batches queued here in FIFO
                self._pending.sort(key=lambda c: c.cls == "best-effort")
                batch, rows, limit = [], 0, self._limit()
                while self._pending and (not batch or rows + self._pending[0].x.shape[0] <= limit):
                    call = self._pending.pop(0)
                    batch.append(call)
                    rows += call.x.shape[0]
                self._rows -= rows
                self._busy += 1
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

    def _limit(self) -> int:
        """Rows the next batch may take: the planned size, or the SLO's bound when it is larger."""
        return self.max_batch if self.bound is None else max(self.max_batch, self.bound.limit())

    def _flush(self, batch: list[_Call]) -> None:
        took = None
        try:
            x = torch.cat([c.x for c in batch]) if len(batch) > 1 else batch[0].x
            t0 = self._clock()
            if tracing.enabled():
                y, headers = self._traced_run(x, batch)
            else:
                y, headers = self._run(x, _batch_class(batch))
            took = (int(x.shape[0]), self._clock() - t0 - _one_time_s(headers))
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
            with self._cv:
                self._busy -= 1
                if took is not None and self.bound is not None:
                    self.bound.observe(*took)
                self._cv.notify()
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


def _one_time_s(headers: dict[str, str]) -> float:
    """What a batch's time spent once (its replica's model upload, the model's load on a unit),
    which is not the batch's own: a bound fitted on it would hold batches small for no reason."""
    spent = 0.0
    for name in (h.UPLOAD_SECONDS, h.LOAD_SECONDS):
        try:
            spent += float(headers.get(name) or 0.0)
        except ValueError:
            pass
    return spent


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
