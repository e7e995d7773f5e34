"""The scheduler daemon's core: the global queue, LALB-O3 over live units, dispatch to managers.

The placement decisions are the `faas_gpu.policies` objects the simulator measures; this module
only feeds them live state (units the GPU Managers report into the datastore, models uploaded
here, the clock) and applies their `Dispatch` decisions by calling the managers' job API. A job
whose manager fails is put back in the queue and placed again, so a manager that dies does not
lose accepted work.

Jobs first wait in PROTEAN's class queue (`ClassQueue`): strict jobs, earliest deadline first,
before best-effort ones, which are held no longer than `be_max_wait_s` while there is capacity
for them; past it they take `be_share` of admissions from strict jobs, so best-effort work always
progresses and a lasting overload does not hand strict work's capacity to it. The placement policy
sees one job per unit, or for LALB a model load time of work per unit (its look-ahead, `_admit`),
so under overload strict work overtakes best-effort work instead of queueing behind it.

Late and abandoned work is not run: a strict job whose deadline passes while it waits is taken out
of the queues and answered 504 as an SLO miss (`deadline_misses`), never started late; a job whose
caller has gone (`abandon`: the job route saw its connection close) is taken out as well, or, when
it already runs, counted (`abandoned_running`). Best-effort jobs have no deadline: they run unless
abandoned. The last check is made as a job is about to be sent to its unit.

PROTEAN's GPU Reconfigurator (`scheduler.reconfigure`, with `--reconfigure`) reads the jobs
resident per unit (`resident_jobs`) and holds a GPU's units (`hold_units`) while it re-slices
the GPU: a held unit is busy to the placement policy, so nothing new lands on it. A unit that
answers it is draining or gone (`X-Faas-Gpu-Unit-State`) leaves the view at once and its job is
placed again.

PROTEAN's Job Distribution (Alg. 1, with a `distributor`: `--distribution protean`) chooses the
MIG slice: before each round the scheduler hands LALB a `JobDistributionPreference` over the
slices of the GPUs the assumptions know (`gpu_views`) and the best-effort memory resident on
each (`resident_counts`, as the Reconfigurator counts it); LALB asks it whenever it chooses
among idle units (`faas_gpu.policies.lalb_job_distribution` says what wins over what).
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from faas_gpu.cordon import cordoned_nodes
from faas_gpu.datastore import Datastore
from faas_gpu.policies import Dispatch, Model, ModelCache, PlacementError, Request, Unit, make_scheduler
from faas_gpu.policies.lalb_job_distribution import JobClass, JobDistributionPreference, MigSlice, be_footprint
from faas_gpu.policies.protean.classes import ClassQueue
from faas_gpu.policies.protean.distribution import JobDistributor, SliceState
from faas_gpu.policies.protean.mig import InvalidGeometry
from gpu_manager.api import FUNCTION_HEADER, UNIT_STATE_HEADER
from gpu_manager.daemon import STATUS_PREFIX
from gpu_manager.model_store import ModelStore

from .gpus import gpu_views
from .residency import Gpu, resident_counts

log = logging.getLogger(__name__)
DEFAULT_LOAD_S = 1.0
DEFAULT_INFER_S = 0.05
EWMA = 0.3
MAX_ATTEMPTS = 5
NO_UNITS_TIMEOUT_S = 10.0  # queued jobs fail with 503 when no GPU Manager has reported for this long
BE_MAX_WAIT_S = 5.0  # a best-effort job waits at most this long behind strict ones
BE_SHARE = 0.25  # ... while overdue best-effort jobs take at most this share of admissions from waiting strict ones
NO_SLO_S = 3600.0  # a strict job without an SLO sorts after those with one
UNAVAILABLE_HOLD_S = 2.0  # a unit that said it is draining or gone gets no job for this long


@dataclass
class JobOutcome:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Job:
    id: int
    digest: str
    payload: bytes
    arrival: float
    deadline: float | None
    done: threading.Event = field(default_factory=threading.Event)
    outcome: JobOutcome | None = None
    attempts: int = 0
    queued: bool = True  # waiting (class queue or the policy's queues), not running
    best_effort: bool = False
    admitted: bool = False  # handed to the placement policy
    model: str | None = None  # the model's name (X-Faas-Gpu-Model), for PROTEAN's slowdown specs
    unit: str | None = None  # node/unit it runs on, while it runs
    function: str | None = None  # name.namespace of the function that sent it (None: the cluster)
    abandoned: bool = False  # its caller has gone: not started if it still waits

    def finish(self, outcome: JobOutcome) -> None:
        self.outcome = outcome
        self.done.set()


class UnitUnavailable(requests.RequestException):
    """The manager says the unit is draining for a reconfiguration or no longer exists."""


@dataclass(frozen=True)
class UnitRef:
    key: str  # node/unit
    node: str
    unit: str
    url: str
    memory_mb: float
    profile: str | None = None  # MIG profile ("4g.20gb"); None for a whole GPU or a CPU


class Scheduler:
    def __init__(
        self,
        datastore: Datastore,
        store: ModelStore,
        token: str,
        *,
        policy: str = "lalb_o3",
        o3_limit: int = 25,
        clock: Callable[[], float] = time.monotonic,
        max_parallel: int = 64,
        no_units_timeout_s: float = NO_UNITS_TIMEOUT_S,
        be_max_wait_s: float = BE_MAX_WAIT_S,
        be_share: float = BE_SHARE,
        distributor: JobDistributor | None = None,
    ):
        """`distributor`: PROTEAN's Job Distribution over MIG slices (None: LALB alone)."""
        self.ds, self.store, self.token = datastore, store, token
        self.policy_name, self.o3_limit, self.clock = policy, o3_limit, clock
        self.http = requests.Session()
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._jobs: dict[int, Job] = {}
        self._next_id = 0
        self._units: list[UnitRef] = []
        self._policy = None
        self._models: dict[str, Model] = {}
        self._stop = threading.Event()
        self.deadline_misses = 0
        self.late_dropped = 0  # strict jobs whose deadline passed before they could start (also misses)
        self.abandoned_dropped = 0  # jobs whose caller left while they waited: never started
        self.abandoned_running = 0  # jobs whose caller left while they ran
        self._deadlines: list[tuple[float, int]] = []  # (deadline, job id) of waiting strict jobs
        self.no_units_timeout_s = no_units_timeout_s
        self._no_units_since: float | None = None
        self.be_max_wait_s, self.be_share = be_max_wait_s, be_share
        self._admission: ClassQueue[Job] = ClassQueue(be_max_wait_s, be_share)
        self._refresh_seq = self._refresh_applied = 0  # a stale read of the reports never wins
        self._held: set[str] = set()  # node/unit keys of units whose GPU is being reconfigured
        self._held_until: dict[str, float] = {}  # units that said they are draining or gone: until when
        self.distributor = distributor
        self._unit_gpu: dict[str, Gpu] = {}  # node/unit key -> its GPU, for MIG units of the distributor's GPU
        self._pool = ThreadPoolExecutor(max_parallel, thread_name_prefix="dispatch")
        self._loop = threading.Thread(target=self._run, name="scheduler", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- live state ----------------------------------------------------------------------
    def refresh_units(self) -> None:
        """Rebuild the policy's units when the managers' reports change; queued jobs carry over.

        Units of cordoned nodes (`faas_gpu.cordon`: a spot node with an eviction notice, one
        being retired) are left out, so nothing new is placed there; their running jobs finish.
        Reads run outside the lock, so one that began before a later, applied read is dropped."""
        with self._lock:
            self._refresh_seq += 1
            seq = self._refresh_seq
        found, reports = [], []
        cordoned = cordoned_nodes(self.ds)
        for kv in self.ds.get_prefix(STATUS_PREFIX):
            try:
                s = json.loads(kv.value)
                reports.append(s)
                if s["node"] in cordoned:
                    continue
                key = f"{s['node']}/{s['unit']}"
                found.append(UnitRef(key, s["node"], s["unit"], s["url"], float(s["memory_mb"]), s.get("profile")))
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a malformed unit report at %s", kv.key)
        found.sort(key=lambda u: u.key)
        views = gpu_views(reports, self.distributor.slowdown.gpu)[0] if self.distributor is not None else {}
        with self._lock:
            if seq < self._refresh_applied:
                return
            self._refresh_applied = seq
            self._unit_gpu = {k: g for g, v in views.items() for k in v.units}
            if not found and any(u.node in cordoned for u in self._units):
                self._units, self._policy = [], None  # every unit left is cordoned: jobs wait for a new one
            if not found:
                self._no_units_since = self._no_units_since or self.clock()
                if self.clock() - self._no_units_since > self.no_units_timeout_s:
                    self._fail_waiting(f"no GPU unit has reported for {self.no_units_timeout_s:g}s")
                return
            self._no_units_since = None
            if [u.key for u in found] == [u.key for u in self._units]:
                return
            old_policy, old_units = self._policy, self._units
            self._units = found
            self._policy = make_scheduler(
                self.policy_name,
                [Unit(id=i, cache=ModelCache(u.memory_mb)) for i, u in enumerate(found)],
                {},
                self.o3_limit,
            )
            for model in list(self._models.values()):
                try:
                    self._policy.add_model(model)
                except PlacementError:  # the units that could hold it are gone
                    del self._models[model.name]
            if old_policy is not None:  # carry what was cached and queued into the new view
                index = {u.key: i for i, u in enumerate(found)}
                for i, u in enumerate(old_units):
                    if u.key in index:
                        new_unit = self._policy.units[index[u.key]]
                        for name in old_policy.units[i].cache.models:
                            new_unit.cache.load(name, self._models[name].size_mb)
                            self._policy.holders.setdefault(name, set()).add(new_unit.id)
            for job in sorted(self._jobs.values(), key=lambda j: j.arrival):
                if not job.queued or not job.admitted:
                    continue
                if job.digest in self._models:
                    self._policy.submit(Request(job.id, job.digest, job.arrival), self.clock())
                else:
                    self._jobs.pop(job.id)
                    job.finish(JobOutcome(507, b"model: no unit left can hold it\n"))
            log.info("scheduling over %d unit(s): %s", len(found), ", ".join(u.key for u in found))
            self._wake.notify_all()

    def _fail_waiting(self, reason: str) -> None:
        """With no unit to run on, queued jobs fail now (503) rather than at their caller's timeout."""
        waiting = [j for j in self._jobs.values() if j.queued]
        if not waiting:
            return
        log.warning("%s: failing %d queued job(s)", reason, len(waiting))
        self._units, self._policy = [], None  # rebuilt when a manager reports again
        self._admission = ClassQueue(self.be_max_wait_s, self.be_share)
        for job in waiting:
            self._jobs.pop(job.id, None)
            job.finish(JobOutcome(503, f"{reason}; retry later\n".encode()))

    def _model(self, digest: str) -> Model:
        model = self._models.get(digest)
        if model is None:
            artifact = self.store.get(digest)
            if artifact is None:
                raise LookupError(f"model: {digest[:12]}… has not been uploaded")
            model = Model(digest, artifact.size / 2**20, DEFAULT_LOAD_S, DEFAULT_INFER_S)
            self._learn(model)
        return model

    def _learn(self, model: Model) -> None:
        if self._policy is not None:
            self._policy.add_model(model)  # raises PlacementError for a model no unit can hold
        self._models[model.name] = model

    # -- jobs ----------------------------------------------------------------------------
    def submit(
        self,
        digest: str,
        payload: bytes,
        deadline_s: float | None = None,
        best_effort: bool = False,
        model: str | None = None,
        function: str | None = None,
    ) -> Job:
        """`deadline_s`: the caller's remaining budget (None: no deadline); one already spent (<= 0)
        makes a strict job miss at once, without running. `function`: who sent it (the GPU Manager
        counts jobs by it), None for the cluster."""
        with self._lock:
            self._model(digest)
            now = self.clock()
            deadline = None if best_effort or deadline_s is None else now + deadline_s
            job = Job(
                self._next_id, digest, payload, now, deadline, best_effort=best_effort, model=model, function=function
            )
            self._next_id += 1
            if deadline is not None and deadline <= now:
                self._miss(job, now)
                return job
            self._jobs[job.id] = job
            self._admission.push(job, now, None if best_effort else (deadline or now + NO_SLO_S))
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, job.id))
            self._admit(now)
            self._wake.notify_all()
        return job

    def abandon(self, job: Job) -> None:
        """The caller of `job` has gone: a waiting job is dropped, never started; a running one is counted."""
        with self._wake:
            if job.done.is_set() or job.abandoned:
                return
            job.abandoned = True
            if self._withdraw(job):
                self.abandoned_dropped += 1
                job.finish(JobOutcome(499, b"the caller has gone; the job was not run\n"))
                self._wake.notify_all()
            else:
                self.abandoned_running += 1
        log.info("job %d: its caller has gone (%s)", job.id, "dropped" if job.done.is_set() else "running")

    def _withdraw(self, job: Job) -> bool:
        """Take a waiting job out of the class queue or the policy's queues (under the lock)."""
        if job.id not in self._jobs or not job.queued:
            return False
        if not job.admitted:
            self._admission.remove(job)
        elif self._policy is not None and self._policy.withdraw(job.id) is None:
            return False  # not in the policy's queues: it is being dispatched
        # (admitted with no policy: every unit went away; refresh_units re-submits what is in _jobs)
        self._jobs.pop(job.id, None)
        return True

    def _miss(self, job: Job, now: float) -> None:
        """A strict job past its deadline before it started: an SLO miss, answered 504, not run."""
        self.deadline_misses += 1
        self.late_dropped += 1
        late_ms = (now - job.deadline) * 1000 if job.deadline is not None else 0.0
        job.finish(
            JobOutcome(
                504,
                f"job {job.id}: missed its deadline ({late_ms:.0f} ms past it) before a GPU unit could "
                f"start it; not run\n".encode(),
                {"X-Faas-Gpu-Deadline-Missed": "true"},
            )
        )

    def _drop_late(self, now: float) -> None:
        """Strict jobs whose deadline has passed while they wait leave the queues (under the lock)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, job_id = heapq.heappop(self._deadlines)
            job = self._jobs.get(job_id)
            if job is not None and job.queued and self._withdraw(job):
                self._miss(job, now)

    def next_deadline_in(self, now: float) -> float | None:
        """Seconds until the earliest deadline of a waiting job (the loop wakes then to drop it)."""
        return self._deadlines[0][0] - now if self._deadlines else None

    def _admit(self, now: float) -> None:
        """Hand the most urgent waiting jobs to the placement policy, up to its look-ahead.

        The look-ahead is one job per unit, and for LALB a model load time of queued work per unit
        (`lookahead_loads`): LALB loads a model on another unit once the holders' backlog reaches
        its load time, so it must see that much backlog to spread a busy model; a strict job then
        waits behind at most about that much admitted work, and behind none of the best-effort
        jobs past it.
        """
        if self._policy is None:
            return
        units = max(1, len(self._units))
        load_s = max((m.load_s for m in self._models.values()), default=DEFAULT_LOAD_S)
        horizon_s = units * load_s * self._policy.lookahead_loads
        n, work = self._policy.queued(), self._policy.queued_work_s()
        while self._admission and (n < units or work < horizon_s):
            job = self._admission.pop(now)
            if job.deadline is not None and job.deadline <= now:  # late: never handed to placement
                self._jobs.pop(job.id, None)
                self._miss(job, now)
                continue
            job.admitted = True
            self._policy.submit(Request(job.id, job.digest, job.arrival), now)
            n += 1
            work += self._policy.models[job.digest].infer_s

    def queued(self) -> int:
        with self._lock:
            return (self._policy.queued() if self._policy else 0) + len(self._admission)

    def resident_jobs(self) -> list[tuple[str | None, bool, str | None]]:
        """(node/unit key, best-effort, model) of every job waiting or running; the key is None
        while the job waits in the global queues, the unit's when it runs or waits in its local queue."""
        with self._lock:
            local: dict[int, str] = {}
            if self._policy is not None:
                for i, u in self._policy.units.items():
                    for r in u.local_queue:
                        if i < len(self._units):
                            local[r.id] = self._units[i].key
            return [(j.unit or local.get(j.id), j.best_effort, j.model) for j in self._jobs.values()]

    # -- holds (a GPU being reconfigured) ------------------------------------------------
    def hold_units(self, keys: set[str]) -> None:
        """Place nothing new on these units (node/unit keys) until `release_units`."""
        with self._wake:
            self._held |= set(keys)
            self._apply_holds()

    def release_units(self, keys: set[str]) -> None:
        with self._wake:
            self._held -= set(keys)
            self._unhold(set(keys) - set(self._held_until))
            self._wake.notify_all()

    def _unhold(self, keys: set[str]) -> None:
        if self._policy is None:
            return
        for i, u in enumerate(self._units):
            if u.key in keys and self._policy.units[i].running is None:
                self._policy.idle.add(i)

    def _apply_holds(self) -> None:
        """A held unit is busy to the placement policy (it may come back idle after each completion)."""
        now = self.clock()
        expired = {k for k, until in self._held_until.items() if until <= now}
        for k in expired:
            del self._held_until[k]
        self._unhold(expired - self._held)
        held = self._held | set(self._held_until)
        if self._policy is None or not held:
            return
        for i, u in enumerate(self._units):
            if u.key in held:
                self._policy.idle.discard(i)

    def _run(self) -> None:
        last_refresh = 0.0
        while not self._stop.is_set():
            if time.monotonic() - last_refresh > 1.0:
                try:
                    self.refresh_units()
                except Exception as exc:
                    log.warning("cannot read unit reports: %s", exc)
                last_refresh = time.monotonic()
            with self._wake:
                decisions, units = self._round()
                if not decisions:
                    until_deadline = self.next_deadline_in(self.clock())
                    self._wake.wait(0.5 if until_deadline is None else max(0.001, min(0.5, until_deadline)))
            for d in decisions:
                self._pool.submit(self._execute, d, units[d.unit])

    def _round(self) -> tuple[list[Dispatch], list[UnitRef]]:
        """One placement round (under the lock): drop late jobs, admit, apply holds, let the policy place."""
        self._drop_late(self.clock())
        self._admit(self.clock())
        self._apply_holds()
        if self._policy is None:
            return [], self._units
        try:
            self._policy.unit_preference = self._job_distribution()
        except Exception:  # a bad report or assumption must not stop placement: LALB alone this round
            log.exception("job distribution: cannot build this round's view; LALB-O3 alone")
            self._policy.unit_preference = None
        decisions = self._policy.schedule(self.clock())
        units = self._units
        for d in decisions:
            job = self._jobs[d.request.id]
            job.queued, job.unit = False, units[d.unit].key
        return decisions, units

    def _job_distribution(self) -> JobDistributionPreference | None:
        """Alg. 1's view of this round (under the lock): the MIG slices of the distributor's GPUs,
        what runs on them, and the best-effort memory resident on each GPU; None when not needed."""
        policy = self._policy
        if self.distributor is None or not self._unit_gpu or not policy.idle or not policy.queue:
            return None
        sd = self.distributor.slowdown
        held = self._held | set(self._held_until)
        slices = []
        for i, u in enumerate(self._units):
            gpu = self._unit_gpu.get(u.key)
            if gpu is None or not u.profile:
                continue
            try:
                profile = sd.gpu.profile(u.profile).key
            except InvalidGeometry:
                continue
            running = policy.units[i].running
            job = self._jobs.get(running.id) if running is not None else None
            known = job is not None and job.model in sd.models
            mem = sd.spec(job.model).mem_mb if known else 0.0
            state = SliceState(
                i,
                profile,
                float(sd.gpu.memory_mb(profile)),
                used_mb=mem,
                running=((job.model, not job.best_effort),) if known else (),
                available=u.key not in held,
                strict_mb=mem if known and not job.best_effort else 0.0,
            )
            slices.append(MigSlice(gpu, state))
        if not slices:
            return None
        open_gpus = {self._unit_gpu[self._units[s.state.id].key] for s in slices if s.state.available}
        counts = resident_counts(self.resident_jobs(), self._unit_gpu, open_gpus)
        be_mem, be_model = be_footprint(counts, sd)
        jobs = {j.id: JobClass(j.model, not j.best_effort) for j in self._jobs.values() if j.queued and j.model}
        return JobDistributionPreference(self.distributor, slices, jobs, be_mem, be_model)

    def _execute(self, d: Dispatch, unit: UnitRef) -> None:
        job = self._jobs[d.request.id]
        if self._not_started(d, unit, job):
            return
        job.attempts += 1
        outcome: JobOutcome | None = None
        retry = False
        try:
            outcome = self._call(unit, job)
        except requests.RequestException as exc:
            log.warning("manager %s failed job %d: %s", unit.key, job.id, exc)
            retry = job.attempts < MAX_ATTEMPTS
            if not retry:
                outcome = JobOutcome(503, f"unit {unit.key}: {exc}\n".encode())
            if isinstance(exc, UnitUnavailable):  # refused, not run: no attempt spent, the unit rests
                job.attempts -= 1
                retry = True
                with self._lock:
                    self._held_until[unit.key] = self.clock() + UNAVAILABLE_HOLD_S
            if isinstance(exc, requests.ConnectionError | UnitUnavailable):
                self._forget_unit(unit)
        with self._wake:
            if self._policy is not None and self._units and d.unit < len(self._units) and self._units[d.unit] == unit:
                self._policy.complete(d.unit, self.clock())
            job.unit = None
            if retry:
                job.queued = True
                if self._policy is not None:
                    self._policy.submit(Request(job.id, job.digest, job.arrival), self.clock())
                self._wake.notify_all()
                return
            self._wake.notify_all()
        if job.deadline is not None and self.clock() > job.deadline:
            self.deadline_misses += 1
            outcome.headers["X-Faas-Gpu-Deadline-Missed"] = "true"
        job.finish(outcome)
        with self._lock:
            self._jobs.pop(job.id, None)

    def _not_started(self, d: Dispatch, unit: UnitRef, job: Job) -> bool:
        """The last check before a job goes to its unit: one whose caller left or whose deadline
        passed since placement is not sent; the unit is given back idle. True when dropped."""
        with self._wake:
            now = self.clock()
            late = job.deadline is not None and now >= job.deadline
            if not (job.abandoned or late):
                return False
            if self._policy is not None and self._units and d.unit < len(self._units) and self._units[d.unit] == unit:
                self._policy.complete(d.unit, now)
            self._jobs.pop(job.id, None)
            job.unit = None
            if job.abandoned:
                self.abandoned_running -= 1  # counted as running when it left; it never ran
                self.abandoned_dropped += 1
                job.finish(JobOutcome(499, b"the caller has gone; the job was not run\n"))
            else:
                self._miss(job, now)
            self._wake.notify_all()
        return True

    def _forget_unit(self, unit: UnitRef) -> None:
        """A manager that does not answer loses its units until it reports again."""
        try:
            self.ds.delete(f"{STATUS_PREFIX}{unit.key}")
            self.refresh_units()
        except Exception as exc:
            log.warning("cannot drop unit %s: %s", unit.key, exc)

    def _call(self, unit: UnitRef, job: Job) -> JobOutcome:
        auth = {"Authorization": f"Bearer {self.token}"}
        url = f"{unit.url}/v1/jobs/{job.digest}"
        headers = {**auth, FUNCTION_HEADER: job.function} if job.function else auth
        for _ in range(2):
            r = self.http.post(url, params={"unit": unit.unit}, data=job.payload, headers=headers, timeout=300)
            if r.status_code == 404 and "not been uploaded" in r.text:
                artifact = self.store.get(job.digest)
                with open(artifact.path, "rb") as fh:
                    up = self.http.put(f"{unit.url}/v1/models", data=fh, headers=auth, timeout=300)
                up.raise_for_status()
                continue
            break
        if r.headers.get(UNIT_STATE_HEADER) in ("draining", "unknown"):
            raise UnitUnavailable(f"unit {unit.key}: {r.headers[UNIT_STATE_HEADER]} ({r.text.strip()[:200]})")
        if r.status_code == 200:
            load_s = float(r.headers.get("X-Faas-Gpu-Load-Seconds", 0))
            exec_s = float(r.headers.get("X-Faas-Gpu-Execute-Seconds", 0))
            with self._lock:
                m = self._models[job.digest]
                load = m.load_s if r.headers.get("X-Faas-Gpu-Cache") == "hit" else (1 - EWMA) * m.load_s + EWMA * load_s
                self._learn(Model(m.name, m.size_mb, load, (1 - EWMA) * m.infer_s + EWMA * exec_s))
        if r.status_code >= 500 and r.status_code != 507:
            r.raise_for_status()  # a manager in trouble: place the job again
        headers = {k: v for k, v in r.headers.items() if k.startswith("X-Faas-Gpu-")}
        headers["X-Faas-Gpu-Queue-Seconds"] = f"{self.clock() - job.arrival:.6f}"
        return JobOutcome(r.status_code, r.content, headers)
