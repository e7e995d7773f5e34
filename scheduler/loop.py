"""The leader loop: the scheduler's periodic run that places work and sends it to the units.

Each round (under the scheduler's lock) drops late jobs, admits the most urgent waiting ones,
applies the holds, and lets the placement policy decide (`faas_gpu.policies`, with PROTEAN's
Job Distribution when on); each `Dispatch` then runs on a pool thread that calls the unit's GPU
Manager (`scheduler.managers`). A job whose manager fails is put back and placed again, so a
manager that dies does not lose accepted work; a unit that answers it is draining or gone
rests a while (`scheduler.units`), and one that does not answer leaves the view until its
manager reports again.

Every time is read from the injected clock: the unit reports are reread once per `REFRESH_S`
of it, so a test's clock drives the loop as the machine's drives the daemon. Only the wait for
new work is real time (a condition wait, woken by new jobs and completions). The reads, and the
removal of a unit whose manager does not answer, run on a thread of their own: no placement
round and no job waits on the datastore, which may be away (issue 42); meanwhile placement goes
on over the units it knows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import requests

from faas_gpu import tracing
from faas_gpu.policies import Dispatch
from faas_gpu.policies.lalb_job_distribution import JobDistributionPreference

from .admission import Admission
from .catalog import ModelCatalog
from .jobs import Job, JobOutcome
from .managers import ManagerClient, UnitUnavailable, job_outcome, measured, model_mb
from .units import UnitRef, UnitView

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5


class DoesNotFitHere(Exception):
    """A manager's 507 for a unit smaller than others: the job is placed again (`outcome`: the
    manager's answer, the caller's if the attempts run out)."""

    def __init__(self, message: str, outcome: JobOutcome):
        super().__init__(message)
        self.outcome = outcome


REFRESH_S = 1.0  # the managers' unit reports are reread at most this often (by the clock)
IDLE_WAIT_S = 0.5  # with nothing placed, the loop looks again after this long (or at the next deadline)


class PlacementLoop:
    def __init__(
        self,
        view: UnitView,
        admission: Admission,
        catalog: ModelCatalog,
        client: ManagerClient,
        wake: threading.Condition,
        clock: Callable[[], float],
        refresh: Callable[[], None],
        preference: Callable[[], JobDistributionPreference | None],
        max_parallel: int = 64,
    ):
        """`refresh`: rereads the units (the scheduler's `refresh_units`); `preference`: this
        round's Job Distribution view, None for LALB alone."""
        self.view, self.admission, self.catalog, self.client = view, admission, catalog, client
        self._wake, self.clock, self.refresh, self.preference = wake, clock, refresh, preference
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_parallel, thread_name_prefix="dispatch")
        self._refresher = ThreadPoolExecutor(1, thread_name_prefix="unit-reports")
        self._refresh_lock = threading.Lock()
        self._refreshing: Future | None = None
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._refresher.shutdown(wait=False, cancel_futures=True)

    def _refresh(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # the datastore away: placement goes on over the units it knows
            log.warning("cannot read unit reports: %s", exc)

    def _refresh_soon(self) -> None:
        """Reread the unit reports on the refresh thread, unless a read is under way: the loop
        never waits on the datastore (issue 42: with etcd stopped, each read held placement for
        its retries, and every job waited behind it)."""
        with self._refresh_lock:
            if self._refreshing is not None and not self._refreshing.done():
                return
            try:
                self._refreshing = self._refresher.submit(self._refresh)
            except RuntimeError:  # closed
                pass

    def _run(self) -> None:
        last_refresh: float | None = None
        while not self._stop.is_set():
            if last_refresh is None or self.clock() - last_refresh > REFRESH_S:
                self._refresh_soon()
                last_refresh = self.clock()
            with self._wake:
                decisions, units = self.round()
                if not decisions:
                    until_deadline = self.admission.next_deadline_in(self.clock())
                    self._wake.wait(
                        IDLE_WAIT_S if until_deadline is None else max(0.001, min(IDLE_WAIT_S, until_deadline))
                    )
            for d in decisions:
                self._pool.submit(self.execute, d, units[d.unit])

    def round(self) -> tuple[list[Dispatch], list[UnitRef]]:
        """One placement round (under the lock): drop late jobs, admit, apply holds, let the policy place."""
        self.admission.drop_late(self.clock())
        self.admission.admit(self.clock())
        self.view.apply_holds()
        policy = self.view.policy
        if policy is None:
            return [], self.view.units
        try:
            policy.unit_preference = self.preference()
        except Exception:  # a bad report or assumption must not stop placement: LALB alone this round
            log.exception("job distribution: cannot build this round's view; LALB-O3 alone")
            policy.unit_preference = None
        t0 = time.perf_counter()  # how long the policy took (a duration for the metrics, not the scheduler's time)
        decisions = policy.schedule(self.clock())
        if decisions and self.admission.metrics is not None:
            self.admission.metrics.placed([d.hit for d in decisions], time.perf_counter() - t0)
        units = self.view.units
        for d in decisions:
            job = self.admission.jobs[d.request.id]
            job.queued, job.unit = False, units[d.unit].key
        return decisions, units

    # -- one dispatch, on a pool thread ----------------------------------------------------
    def execute(self, d: Dispatch, unit: UnitRef) -> None:
        job = self.admission.jobs[d.request.id]
        if self._not_started(d, unit, job):
            return
        if job.started is None:
            job.started = self.clock()
        job.attempts += 1
        outcome: JobOutcome | None = None
        retry = not_kept = False
        try:
            if job.trace is not None and tracing.enabled():
                outcome = self._traced_call(unit, job)
            else:
                outcome = self._call(unit, job)
        except DoesNotFitHere as exc:  # placed again, on a larger unit only
            log.warning("job %d: %s", job.id, exc)
            not_kept = True
            retry = job.attempts < MAX_ATTEMPTS
            if not retry:
                outcome = exc.outcome
        except requests.RequestException as exc:
            log.warning("manager %s failed job %d: %s", unit.key, job.id, exc)
            retry = job.attempts < MAX_ATTEMPTS
            if not retry:
                outcome = JobOutcome(503, f"unit {unit.key}: {exc}\n".encode())
            if isinstance(exc, UnitUnavailable):  # refused, not run: no attempt spent, the unit rests
                job.attempts -= 1
                retry = True
                with self._wake:
                    self.view.rest(unit.key)
            if isinstance(exc, requests.ConnectionError | UnitUnavailable):
                with self._wake:  # no job for it meanwhile: its report is dropped on the refresh thread
                    self.view.rest(unit.key)
                try:
                    self._refresher.submit(self._forget_unit, unit)
                except RuntimeError:  # closed
                    pass
        not_kept = not_kept or (outcome is not None and outcome.status == 507)
        with self._wake:
            if self.view.is_current(d.unit, unit):
                self.view.policy.complete(d.unit, self.clock())
                if not_kept:  # the manager did not load it: placement must not count on it being there
                    self.view.policy.unload(d.unit, job.digest)
            job.unit = None
            if retry:
                self.admission.requeue(job)
                self._wake.notify_all()
                return
            self._wake.notify_all()
        self.admission.finish(job, outcome)

    def _not_started(self, d: Dispatch, unit: UnitRef, job: Job) -> bool:
        """The last check before a job goes to its unit: one whose caller left or whose deadline
        passed since placement is not sent; the unit is given back idle. True when dropped."""
        with self._wake:
            now = self.clock()
            if not self.admission.unwanted(job, now):
                return False
            if self.view.is_current(d.unit, unit):
                self.view.policy.complete(d.unit, now)
            self.admission.drop_placed(job, now)
            self._wake.notify_all()
        return True

    def _traced_call(self, unit: UnitRef, job: Job) -> JobOutcome:
        """`_call` with the job's queueing (admission to this dispatch) and its hop to the GPU
        Manager as spans of the job route's trace; a retried job's queueing counts from admission."""
        tracing.record("scheduler.queue", job.trace, job.trace.at_ns, attributes={"faas_gpu.attempt": job.attempts})
        with tracing.span("scheduler.dispatch", job.trace, kind="client", attributes={"faas_gpu.unit": unit.key}):
            return self._call(unit, job)

    def _call(self, unit: UnitRef, job: Job) -> JobOutcome:
        r = self.client.run_job(unit, job)
        if r.status_code == 507:
            with self._wake:  # larger units may hold it: the model's size is at least this unit's
                larger = self.catalog.outgrew(job.digest, unit.memory_mb, self.view.policy)
            if larger:
                raise DoesNotFitHere(
                    f"model {job.digest[:12]} does not fit unit {unit.key} ({unit.memory_mb:.0f} MB) even alone; "
                    "placing it on a larger one",
                    job_outcome(r, self.clock() - job.arrival),
                )
        if r.status_code == 200:
            cache_hit, load_s, exec_s = measured(r)
            if not cache_hit and self.client.on_loaded is not None:  # a cold start: shown in /v1/status
                self.client.on_loaded(job.digest, unit.key, load_s)
            with self._wake:
                self.catalog.observe(job.digest, self.view.policy, cache_hit, load_s, exec_s, model_mb(r))
        return job_outcome(r, self.clock() - job.arrival)

    def _forget_unit(self, unit: UnitRef) -> None:
        """A manager that does not answer loses its units until it reports again."""
        try:
            self.view.forget(unit)
            self.refresh()
        except Exception as exc:
            log.warning("cannot drop unit %s: %s", unit.key, exc)
