"""The scheduler daemon's core: the global queue, LALB-O3 over live units, dispatch to managers.

The placement decisions are the `faas_gpu.policies` objects the simulator measures; the scheduler
only feeds them live state and applies their `Dispatch` decisions. `Scheduler` is the façade the
API, the daemon and PROTEAN's GPU Reconfigurator use; each role is its own module:
- `scheduler.units`: the unit view (units from the managers' reports, the placement policy
  over them) and holds;
- `scheduler.catalog`: the models uploaded here and their learnt load and run times;
- `scheduler.admission`: admission and queues (PROTEAN's class queue, the look-ahead handed to
  placement, late and abandoned jobs dropped unrun);
- `scheduler.loop`: the leader loop (placement rounds, dispatch, retries);
- `scheduler.managers`: the HTTP client of the GPU Managers;
- `scheduler.distribution`: PROTEAN's Job Distribution (Alg. 1) view of each round;
- `scheduler.reconfigure` (with `scheduler.gpus`, `scheduler.residency`): PROTEAN's GPU
  Reconfigurator, which reads `resident_jobs` and holds a GPU's units (`hold_units`) while it
  re-slices the GPU.

The parts share one lock (a condition the loop sleeps on) and read the time from one injected
`clock`; nothing here reads the machine's clock but the default.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from faas_gpu.datastore import Datastore
from faas_gpu.models import ModelStore
from faas_gpu.policies import Dispatch, Model
from faas_gpu.policies.lalb_job_distribution import JobDistributionPreference
from faas_gpu.policies.protean.classes import ClassQueue
from faas_gpu.policies.protean.distribution import JobDistributor

from .admission import BE_MAX_WAIT_S, BE_SHARE, Admission
from .catalog import ModelCatalog, Placement
from .distribution import job_distribution
from .jobs import Job
from .leases import lease_unit
from .loop import PlacementLoop
from .managers import ManagerClient
from .metrics import SchedulerMetrics, leased_late
from .model_states import ModelStates
from .residency import Gpu
from .units import NO_UNITS_TIMEOUT_S, Refresh, UnitRef, UnitView

log = logging.getLogger(__name__)


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
        self.clock = clock
        self.distributor = distributor
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self.view = UnitView(datastore, self._now, policy, o3_limit, no_units_timeout_s)
        self.catalog = ModelCatalog(store)
        self.metrics = SchedulerMetrics(policy)  # `/metrics` (the API serves it)
        self.admission = Admission(
            self.view, self.catalog, self._wake, self._now, be_max_wait_s, be_share, metrics=self.metrics
        )
        self.metrics.read_queues(lambda: list(self.admission.jobs.values()), self._wake)
        self.model_states = ModelStates(self._now)  # each model's cold start, for /v1/status
        self.client = ManagerClient(store, token, on_copy=self.model_states.copying, on_loaded=self.model_states.loaded)
        self.http = self.client.http
        self.loop = PlacementLoop(
            self.view,
            self.admission,
            self.catalog,
            self.client,
            self._wake,
            self._now,
            self.refresh_units,
            self._job_distribution,
            max_parallel,
        )

    def _now(self) -> float:
        """The parts read the time through here, so a clock set on the scheduler later reaches them all."""
        return self.clock()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def close(self) -> None:
        self.loop.close()

    # -- live state ----------------------------------------------------------------------
    def refresh_units(self) -> None:
        """Rebuild the policy's units when the managers' reports change; queued jobs carry over.

        Units of cordoned nodes (`faas_gpu.cordon`: a spot node with an eviction notice, one
        being retired) are left out, so nothing new is placed there; their running jobs finish.
        Reads run outside the lock, so one that began before a later, applied read is dropped."""
        with self._lock:
            seq = self.view.next_read()
        read = self.view.read(seq, self.distributor.slowdown.gpu if self.distributor is not None else None)
        with self._wake:
            change = self.view.apply(read, self.catalog)
            if change is Refresh.TIMED_OUT:
                self.admission.fail_waiting(f"no GPU unit has reported for {self.view.no_units_timeout_s:g}s")
            elif change is Refresh.REBUILT:
                self.admission.resubmit()
                units = self.view.units
                log.info("scheduling over %d unit(s): %s", len(units), ", ".join(u.key for u in units))
                self._wake.notify_all()

    def _job_distribution(self) -> JobDistributionPreference | None:
        return job_distribution(self.distributor, self.view, self.admission.jobs, self.resident_jobs)

    # -- jobs ----------------------------------------------------------------------------
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
        counts jobs by it), None for the cluster. `rows` (the batch's size) and `app` (its
        HarmonyBatch application) are for the metrics; `trace`: the caller's span (`faas_gpu.tracing`)."""
        return self.admission.submit(digest, payload, deadline_s, best_effort, model, function, rows, app, trace)

    def lease(self, digest: str, best_effort: bool = False) -> UnitRef | None:
        """The unit whose GPU Manager may take `digest`'s batches directly for a while (a placement
        lease, `scheduler.leases`), or None: send them here."""
        with self._wake:
            self.catalog.get(digest, self.view.policy)  # LookupError for a model never uploaded
            return lease_unit(self.view, self.admission, digest, best_effort, self.distributor is not None)

    def leased_ran(self, digest: str, model: str | None, function: str | None, ran: list) -> None:
        """A function's batches run on a leased unit: counted in the metrics (and those its unit
        dropped past their deadline in the misses), and their execution times learnt as a placed
        job's are."""
        times = self.metrics.leased(digest, model, function, ran)
        late = leased_late(ran)
        if late:  # dropped late by their unit: misses in /v1/status as the scheduler's own late drops
            with self._wake:
                self.admission.deadline_misses += late
                self.admission.late_dropped += late
        if times:
            with self._wake:
                if digest in self.catalog.models:
                    self.catalog.observe(digest, self.view.policy, True, 0.0, sum(times) / len(times))

    def abandon(self, job: Job) -> None:
        """The caller of `job` has gone: a waiting job is dropped, never started; a running one is counted."""
        self.admission.abandon(job)

    def next_deadline_in(self, now: float) -> float | None:
        """Seconds until the earliest deadline of a waiting job (the loop wakes then to drop it)."""
        return self.admission.next_deadline_in(now)

    def queued(self) -> int:
        return self.admission.queued()

    def resident_jobs(self) -> list[tuple[str | None, bool, str | None]]:
        """(node/unit key, best-effort, model) of every job waiting or running; the key is None
        while the job waits in the global queues, the unit's when it runs or waits in its local queue."""
        return self.admission.resident_jobs()

    @property
    def deadline_misses(self) -> int:
        return self.admission.deadline_misses

    @property
    def late_dropped(self) -> int:
        return self.admission.late_dropped

    @property
    def abandoned_dropped(self) -> int:
        return self.admission.abandoned_dropped

    @property
    def abandoned_running(self) -> int:
        return self.admission.abandoned_running

    # -- holds (a GPU being reconfigured) ------------------------------------------------
    def hold_units(self, keys: set[str]) -> None:
        """Place nothing new on these units (node/unit keys) until `release_units`."""
        with self._wake:
            self.view.hold(keys)

    def release_units(self, keys: set[str]) -> None:
        with self._wake:
            self.view.release(keys)
            self._wake.notify_all()

    # -- the parts' state under their former names (the API's status and tests read them) ---
    @property
    def _units(self) -> list[UnitRef]:
        return self.view.units

    @property
    def _policy(self) -> Placement | None:
        return self.view.policy

    @property
    def _held(self) -> set[str]:
        return self.view.held

    @property
    def _unit_gpu(self) -> dict[str, Gpu]:
        return self.view.unit_gpu

    @property
    def _models(self) -> dict[str, Model]:
        return self.catalog.models

    @property
    def _jobs(self) -> dict[int, Job]:
        return self.admission.jobs

    @property
    def _admission(self) -> ClassQueue[Job]:
        return self.admission.queue

    def _admit(self, now: float) -> None:
        self.admission.admit(now)

    def _apply_holds(self) -> None:
        self.view.apply_holds()

    def _round(self) -> tuple[list[Dispatch], list[UnitRef]]:
        return self.loop.round()

    def _execute(self, d: Dispatch, unit: UnitRef) -> None:
        self.loop.execute(d, unit)
