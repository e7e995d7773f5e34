"""What the scheduler counts for `/metrics`: jobs per model (Triton's names), batch sizes and the
SLO per function, queue depth per class, placement decisions and their time.

The names, HELP and labels are the contract's (`faas_gpu.contract.metrics`); this module only says
where a job's figures come from. Events are counted where they happen (a job admitted, a job
answered, a placement round), with no lock beyond prometheus_client's own; the queue depth is
read when scraped.

Labels stay bounded: a model is labelled by the first name given for its digest (digests exist
only once uploaded), a function by its credentials' `name.namespace`, and each function by at
most `MAX_APPS` app names (the rest are `other`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from faas_gpu.contract import headers as h
from faas_gpu.contract import metrics as m
from faas_gpu.contract.annotations import APP_NAME_RE
from faas_gpu.observability import DaemonMetrics

from .jobs import Job, JobOutcome

MAX_APPS = 32  # app label values per function; a function that sends more gets `other` for the rest
OTHER_APP = "other"


def app_label(raw: str | None) -> str:
    """The job's app (`X-Faas-Gpu-App`) when it is a valid app name, else empty."""
    app = (raw or "").strip()
    return app if APP_NAME_RE.match(app) else ""


def _seconds(headers: dict[str, str], name: str) -> float:
    try:
        return max(0.0, float(headers.get(name, 0)))
    except ValueError:
        return 0.0



MAX_REPORTED_EXEC_S = 3600.0
"""A leased batch's execution time as its function reports it is learnt as a placed job's: a
report beyond an hour (the policies' bound on any SLO), or not a number, is none a worker measured."""

class SchedulerMetrics:
    def __init__(self, policy: str):
        self.metrics = DaemonMetrics(m.Daemon.SCHEDULER)
        self.policy = policy
        c = self.metrics.counter
        self._success, self._failure = c(m.INFERENCE_REQUEST_SUCCESS), c(m.INFERENCE_REQUEST_FAILURE)
        self._count, self._exec = c(m.INFERENCE_COUNT), c(m.INFERENCE_EXEC_COUNT)
        self._queue_us, self._compute_us = c(m.INFERENCE_QUEUE_DURATION_US), c(m.INFERENCE_COMPUTE_INFER_DURATION_US)
        self._slo = c(m.SLO_JOBS)
        self._placed = c(m.PLACEMENT_DECISIONS)
        self._batch = self.metrics.histogram(m.BATCH_SIZE)
        self._placement_s = self.metrics.histogram(m.PLACEMENT_DURATION)
        self._names: dict[str, str] = {}  # digest -> model label (first name given wins)
        self._apps: dict[str, set[str]] = {}  # function -> app labels given out

    # -- labels --------------------------------------------------------------------------------
    def _model(self, job: Job) -> tuple[str, str]:
        version = job.digest[:12]
        return self._names.setdefault(job.digest, job.model or version), version

    def _app(self, function: str, app: str) -> str:
        if not app:
            return ""
        apps = self._apps.setdefault(function, set())
        if app in apps:
            return app
        if len(apps) >= MAX_APPS:
            return OTHER_APP
        apps.add(app)  # a race may admit one more than MAX_APPS: still bounded
        return app

    # -- events --------------------------------------------------------------------------------
    def submitted(self, job: Job) -> None:
        self._batch.labels(job.function or m.CLUSTER_FUNCTION).observe(job.rows)

    def placed(self, hits: list[bool], seconds: float) -> None:
        """One placement round that placed `len(hits)` jobs, taking `seconds`."""
        for hit in hits:
            self._placed.labels(self.policy, "hit" if hit else "miss").inc()
        self._placement_s.labels(self.policy).observe(seconds)

    def finished(self, job: Job, outcome: JobOutcome, now: float) -> None:
        """A job answered (run, refused, or dropped unrun): Triton's per-model counts and the SLO."""
        model = self._model(job)
        queued_until = job.started if job.started is not None else now
        self._queue_us.labels(*model).inc(max(0.0, queued_until - job.arrival) * 1e6)
        if outcome.status == 200:
            self._success.labels(*model).inc()
            self._count.labels(*model).inc(job.rows)
            self._exec.labels(*model).inc()
            self._compute_us.labels(*model).inc(_seconds(outcome.headers, h.EXECUTE_SECONDS) * 1e6)
        else:
            self._failure.labels(*model).inc()
        if job.deadline is None or not (outcome.status == 200 or outcome.headers.get(h.DEADLINE_MISSED) == "true"):
            return  # no SLO, or an error that says nothing about it (the job's failure is counted above)
        within = outcome.status == 200 and outcome.headers.get(h.DEADLINE_MISSED) != "true"
        function = job.function or m.CLUSTER_FUNCTION
        self._slo.labels(function, self._app(function, job.app), "within" if within else "over").inc()

    def leased(
        self, digest: str, model: str | None, function: str | None, ran: list, *, most: int = 4096
    ) -> list[float]:
        """Batches a function ran on a leased unit (`POST /v1/leases` reports them: [[rows, status,
        execute s, had an SLO, app], ...]), counted as the jobs that come through here are; no
        queueing (a leased batch waits for nothing here). The execution times of those answered."""
        job = Job(0, digest, b"", 0.0, None, model=model, function=function)
        model_labels = self._model(job)
        fn = function or m.CLUSTER_FUNCTION
        times = []
        for entry in ran[:most] if isinstance(ran, list) else []:
            try:
                rows, status, exec_s, slo, app = entry
                rows, status, exec_s = int(rows), int(status), float(exec_s)
            except (TypeError, ValueError):
                continue
            if rows < 1 or rows > 1_000_000 or not 0.0 <= exec_s <= MAX_REPORTED_EXEC_S:  # NaN and inf too
                continue
            self._batch.labels(fn).observe(rows)
            if status != 200:
                self._failure.labels(*model_labels).inc()
                continue
            times.append(exec_s)
            self._success.labels(*model_labels).inc()
            self._count.labels(*model_labels).inc(rows)
            self._exec.labels(*model_labels).inc()
            self._compute_us.labels(*model_labels).inc(exec_s * 1e6)
            if slo is True:
                self._slo.labels(fn, self._app(fn, app_label(app if isinstance(app, str) else "")), "within").inc()
        return times

    # -- readings ------------------------------------------------------------------------------
    def read_queues(self, jobs: Callable[[], list[Job]], wake: threading.Condition) -> None:
        """Queue depth per class, read at scrape time from the jobs still waiting (under the lock)."""

        def reader():
            with wake:
                waiting = [j.best_effort for j in jobs() if j.queued]
            best_effort = sum(waiting)
            return {m.QUEUE_DEPTH: [(("strict",), len(waiting) - best_effort), (("best-effort",), best_effort)]}

        self.metrics.add_reader(reader)
