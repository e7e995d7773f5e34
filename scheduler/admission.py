"""Admission and queues: which accepted job is handed to placement next, and which is not run.

Jobs first wait in PROTEAN's class queue (`ClassQueue`): strict jobs, earliest deadline first,
before best-effort ones, which are held no longer than `be_max_wait_s` while there is capacity
for them; past it they take `be_share` of admissions from strict jobs, so best-effort work always
progresses and a lasting overload does not hand strict work's capacity to it. The placement policy
sees one job per unit, or for LALB a model load time of work per unit (its look-ahead, `admit`),
so under overload strict work overtakes best-effort work instead of queueing behind it.

Late and abandoned work is not run: a strict job whose deadline passes while it waits is taken out
of the queues and answered 504 as an SLO miss (`deadline_misses`), never started late; a job whose
caller has gone (`abandon`: the job route saw its connection close) is taken out as well, or, when
it already runs, counted (`abandoned_running`). Best-effort jobs have no deadline: they run unless
abandoned. The last check is made as a job is about to be sent to its unit (`unwanted`).

Guarded by the scheduler's one lock (`wake`, the condition the leader loop sleeps on); methods
that do not take it say so.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable
from typing import Any

from faas_gpu.contract.errors import DeadlineMissed, deadline_missed_headers
from faas_gpu.contract.headers import DEADLINE_MISSED
from faas_gpu.policies import LookAhead, Request
from faas_gpu.policies.protean.classes import BE_MAX_WAIT_S, BE_SHARE, ClassQueue, admission_queue, admit

from .catalog import ModelCatalog
from .jobs import Job, JobOutcome
from .metrics import SchedulerMetrics
from .units import UnitView

log = logging.getLogger(__name__)
NO_SLO_S = 3600.0  # a strict job without an SLO sorts after those with one
GONE = b"the caller has gone; the job was not run\n"


class Admission:
    def __init__(
        self,
        view: UnitView,
        catalog: ModelCatalog,
        wake: threading.Condition,
        clock: Callable[[], float],
        be_max_wait_s: float = BE_MAX_WAIT_S,
        be_share: float = BE_SHARE,
        metrics: SchedulerMetrics | None = None,
    ):
        """`metrics`: where every answered job is counted (`scheduler.metrics`), None for none."""
        self.view, self.catalog, self._wake, self.clock = view, catalog, wake, clock
        self.metrics = metrics
        self.be_max_wait_s, self.be_share = be_max_wait_s, be_share
        self.jobs: dict[int, Job] = {}  # every job waiting or running
        self._next_id = 0
        self.queue: ClassQueue[Job] = admission_queue(be_max_wait_s, be_share)
        self._deadlines: list[tuple[float, int]] = []  # (deadline, job id) of waiting strict jobs
        self.deadline_misses = 0
        self.late_dropped = 0  # strict jobs whose deadline passed before they could start (also misses)
        self.abandoned_dropped = 0  # jobs whose caller left while they waited: never started
        self.abandoned_running = 0  # jobs whose caller left while they ran

    # -- in --------------------------------------------------------------------------------
    def submit(
        self,
        digest: str,
        payload: bytes,
        deadline_s: float | None = None,
        best_effort: bool = False,
        model: str | None = None,
        function: str | None = None,
        rows: int = 1,
        app: str = "",
        trace: Any = None,
    ) -> Job:
        """`deadline_s`: the caller's remaining budget (None: no deadline); one already spent (<= 0)
        makes a strict job miss at once, without running. `function`: who sent it (the GPU Manager
        counts jobs by it), None for the cluster. `rows`: the batch's size; `app`: its
        HarmonyBatch application ("" for none); both for the metrics."""
        with self._wake:
            self.catalog.get(digest, self.view.policy)
            now = self.clock()
            deadline = None if best_effort or deadline_s is None else now + deadline_s
            job = Job(
                self._next_id,
                digest,
                payload,
                now,
                deadline,
                best_effort=best_effort,
                model=model,
                function=function,
                rows=rows,
                app=app,
                trace=trace,
            )
            self._next_id += 1
            if self.metrics is not None:
                self.metrics.submitted(job)
            if deadline is not None and deadline <= now:
                self.miss(job, now)
                return job
            self.jobs[job.id] = job
            self.queue.push(job, now, None if best_effort else (deadline or now + NO_SLO_S))
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, job.id))
            self.admit(now)
            self._wake.notify_all()
        return job

    def admit(self, now: float) -> None:
        """Hand the most urgent waiting jobs to the placement policy, up to its look-ahead (under the lock).

        The look-ahead is one job per unit, and for LALB a model load time of queued work per unit
        (`lookahead_loads`): LALB loads a model on another unit once the holders' backlog reaches
        its load time, so it must see that much backlog to spread a busy model; a strict job then
        waits behind at most about that much admitted work, and behind none of the best-effort
        jobs past it.
        """
        policy = self.view.policy
        if policy is None:
            return
        window = LookAhead(policy, len(self.view.units), self.catalog.longest_load_s())
        for entry in admit(self.queue, now, window.room):
            job = entry.item
            if job.deadline is not None and job.deadline <= now:  # late: never handed to placement
                self.jobs.pop(job.id, None)
                self.miss(job, now)
                continue
            job.admitted = True
            policy.submit(Request(job.id, job.digest, job.arrival), now)
            window.took(policy.models[job.digest].infer_s)

    def resubmit(self) -> None:
        """The unit view was rebuilt: admitted jobs that still wait go to the new policy, in
        arrival order; one whose model no unit left can hold fails (507). Under the lock."""
        policy = self.view.policy
        for job in sorted(self.jobs.values(), key=lambda j: j.arrival):
            if not job.queued or not job.admitted:
                continue
            if job.digest in self.catalog.models:
                policy.submit(Request(job.id, job.digest, job.arrival), self.clock())
            else:
                self.jobs.pop(job.id)
                self.answer(job, JobOutcome(507, b"model: no unit left can hold it\n"))

    def requeue(self, job: Job) -> None:
        """Its unit failed it or refused it: the job waits to be placed again (under the lock)."""
        job.queued = True
        if self.view.policy is not None:
            self.view.policy.submit(Request(job.id, job.digest, job.arrival), self.clock())

    # -- out -------------------------------------------------------------------------------
    def abandon(self, job: Job) -> None:
        """The caller of `job` has gone: a waiting job is dropped, never started; a running one is counted."""
        with self._wake:
            if job.done.is_set() or job.abandoned:
                return
            job.abandoned = True
            if self.withdraw(job):
                self.abandoned_dropped += 1
                self.answer(job, JobOutcome(499, GONE))
                self._wake.notify_all()
            else:
                self.abandoned_running += 1
        log.info("job %d: its caller has gone (%s)", job.id, "dropped" if job.done.is_set() else "running")

    def withdraw(self, job: Job) -> bool:
        """Take a waiting job out of the class queue or the policy's queues (under the lock)."""
        if job.id not in self.jobs or not job.queued:
            return False
        if not job.admitted:
            self.queue.remove(job)
        elif self.view.policy is not None and self.view.policy.withdraw(job.id) is None:
            return False  # not in the policy's queues: it is being dispatched
        # (admitted with no policy: every unit went away; the unit view's rebuild re-submits what is in jobs)
        self.jobs.pop(job.id, None)
        return True

    def miss(self, job: Job, now: float) -> None:
        """A strict job past its deadline before it started: an SLO miss, answered 504, not run."""
        self.deadline_misses += 1
        self.late_dropped += 1
        late_ms = (now - job.deadline) * 1000 if job.deadline is not None else 0.0
        exc = DeadlineMissed(str(job.id), late_ms)
        self.answer(job, JobOutcome(exc.status, f"{exc}\n".encode(), deadline_missed_headers(exc)))

    def drop_late(self, now: float) -> None:
        """Strict jobs whose deadline has passed while they wait leave the queues (under the lock)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, job_id = heapq.heappop(self._deadlines)
            job = self.jobs.get(job_id)
            if job is not None and job.queued and self.withdraw(job):
                self.miss(job, now)

    def next_deadline_in(self, now: float) -> float | None:
        """Seconds until the earliest deadline of a waiting job (the loop wakes then to drop it)."""
        return self._deadlines[0][0] - now if self._deadlines else None

    def unwanted(self, job: Job, now: float) -> bool:
        """The last check before a placed job goes to its unit: its caller left or its deadline passed."""
        return job.abandoned or (job.deadline is not None and now >= job.deadline)

    def drop_placed(self, job: Job, now: float) -> None:
        """An `unwanted` job that was placed is not sent after all (under the lock)."""
        self.jobs.pop(job.id, None)
        job.unit = None
        if job.abandoned:
            self.abandoned_running -= 1  # counted as running when it left; it never ran
            self.abandoned_dropped += 1
            self.answer(job, JobOutcome(499, GONE))
        else:
            self.miss(job, now)

    def finish(self, job: Job, outcome: JobOutcome) -> None:
        """A unit answered: the caller gets it, marked when the deadline passed meanwhile (not under the lock)."""
        if job.deadline is not None and self.clock() > job.deadline:
            self.deadline_misses += 1
            outcome.headers[DEADLINE_MISSED] = "true"
        self.answer(job, outcome)
        with self._wake:
            self.jobs.pop(job.id, None)

    def answer(self, job: Job, outcome: JobOutcome) -> None:
        """Every job ends here: counted first (a caller that scrapes right after its answer sees it), then answered."""
        if self.metrics is not None:
            self.metrics.finished(job, outcome, self.clock())
        job.finish(outcome)

    def fail_waiting(self, reason: str) -> None:
        """With no unit to run on, queued jobs fail now (503) rather than at their caller's timeout."""
        waiting = [j for j in self.jobs.values() if j.queued]
        if not waiting:
            return
        log.warning("%s: failing %d queued job(s)", reason, len(waiting))
        self.view.clear()  # rebuilt when a manager reports again
        self.queue = admission_queue(self.be_max_wait_s, self.be_share)
        for job in waiting:
            self.jobs.pop(job.id, None)
            self.answer(job, JobOutcome(503, f"{reason}; retry later\n".encode()))

    # -- what waits and runs ---------------------------------------------------------------
    def queued(self) -> int:
        with self._wake:
            return (self.view.policy.queued() if self.view.policy else 0) + len(self.queue)

    def resident_jobs(self) -> list[tuple[str | None, bool, str | None]]:
        """(node/unit key, best-effort, model) of every job waiting or running; the key is None
        while the job waits in the global queues, the unit's when it runs or waits in its local queue."""
        with self._wake:
            local = self.view.local_jobs()
            return [(j.unit or local.get(j.id), j.best_effort, j.model) for j in self.jobs.values()]
