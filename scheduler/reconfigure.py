"""PROTEAN's GPU Reconfigurator, live (§4.4, Alg. 2): the scheduler leader re-slices MIG GPUs.

The decision is the pure `Reconfigurator` the simulator measures; this controller only feeds it
and applies what it returns:
- *observe*: every `sample_s` it counts the jobs resident per GPU (`scheduler.residency`:
  running on or queued in the local queue of one of its MIG units, an equal share of those in
  the global queues). `ResidencyMeter` turns the samples into the mean over the monitor
  interval W, and the best-effort model resident the longest is the GPU's BE model (the last
  one seen, while a GPU has none).
- *decide*: every W it calls `Reconfigurator.observe(observations, now)`; the policy's EWMA,
  wait limit (3 similar mismatches) and 30%-of-GPUs cap apply.
- *apply*: for each `Reconfiguration` it holds the GPU's units in the scheduler (nothing new is
  placed there), asks the GPU's manager for the new geometry (`scheduler.managers.set_geometry`:
  it drains the units, re-slices the GPU and reports the new units), then releases the hold and
  rereads the units.
  A refusal (409: units did not drain, or NVML refused a destroy as in use; 5xx) or a manager
  that does not answer is logged and tried again, if the policy still wants that geometry and
  the cap allows: at the next decision the first time, then backing off (the interval doubled
  each time, up to `max_backoff_s`, and never before the manager's `Retry-After`), since each
  attempt drains the GPU's units and flushes their caches; a 400 (the manager cannot take the
  geometry) is logged and left to the policy's next decision. A 403 (the manager may not change
  MIG geometry: not root, no mig-config capability) is never retried: the GPU is left alone,
  as not reconfigurable, for `forbidden_s` (a capability may be granted meanwhile).

Only MIG units whose GPU is the assumptions file's GPU model (A100-40GB by default) are
managed (`scheduler.gpus` reads them from the managers' reports). Jobs whose model is
not in the assumptions file count as resident jobs, but only a known model gives BE memory.
Only the scheduler leader acts; a new leader starts its observations afresh.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import requests

from faas_gpu.policies.protean.mig import Geometry
from faas_gpu.policies.protean.reconfigurator import (
    GpuObservation,
    ReconfigDecision,
    Reconfiguration,
    Reconfigurator,
)

from .gpus import GpuView, gpu_key, read_gpus, slice_memory
from .managers import set_geometry
from .residency import CountKey, Gpu, Residency, ResidencyMeter, resident_counts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    gpu: Gpu
    current: Geometry
    target: Geometry
    decided_at: float
    status: str  # "done" | "refused" | "invalid" | "unreachable" | "error"
    detail: str = ""


class ReconfigController:
    """Drives one `Reconfigurator` over the MIG GPUs the scheduler places on.

    `scheduler`: a `scheduler.core.Scheduler` (its `ds`, `clock`, `resident_jobs`, `hold_units`,
    `release_units` and `refresh_units`).

    `sample(now)` and `step(now)` are the whole loop, with the time passed in, so tests drive it
    tick by tick; `start()` runs them on a thread (sampling every `sample_s`, deciding every
    `interval_s`) while `is_leader()`. With an `executor`, the managers' calls run on it and a
    decision does not wait for a GPU to drain; without one they run inline.
    """

    def __init__(
        self,
        scheduler: Any,
        reconfigurator: Reconfigurator,
        token: str,
        *,
        interval_s: float = 1.0,
        sample_s: float | None = None,
        drain_timeout_s: float = 10.0,
        is_leader: Callable[[], bool] = lambda: True,
        executor: Executor | None = None,
        clock: Callable[[], float] | None = None,
        http: Any | None = None,
        max_backoff_s: float = 300.0,
        forbidden_s: float = 3600.0,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s}")
        self.scheduler, self.reconfigurator, self.token = scheduler, reconfigurator, token
        self.gpu_model = reconfigurator.gpu
        self.models = reconfigurator.slowdown.models
        self.interval_s = interval_s
        self.sample_s = sample_s if sample_s is not None else interval_s / 10
        self.drain_timeout_s = drain_timeout_s
        self.is_leader, self.executor = is_leader, executor
        self.clock = clock or scheduler.clock
        self.http = http or requests.Session()
        self._lock = threading.Lock()
        self.meter = ResidencyMeter(self.clock())
        self._views: dict[Gpu, GpuView] = {}
        self._inflight: dict[Gpu, GpuView] = {}
        self._retry: dict[Gpu, Geometry] = {}
        self.max_backoff_s, self.forbidden_s = max_backoff_s, forbidden_s
        self._refusals: dict[Gpu, int] = {}  # refusals in a row, for the back-off
        self._not_before: dict[Gpu, float] = {}  # no new attempt before this time
        self._forbidden: dict[Gpu, tuple[float, str]] = {}  # 403: left alone until, and why
        self._be_model: dict[Gpu, str] = {}
        self._last_be_model: str | None = None
        self._skipped: dict[Gpu, str] = {}
        self._targets: dict[Gpu, Geometry] = {}
        self.outcomes: deque[Outcome] = deque(maxlen=50)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reconfigurator", daemon=True)

    # -- observe ----------------------------------------------------------------------------
    def sample(self, now: float, counts: Mapping[CountKey, float] | None = None) -> None:
        """Record the jobs resident from `now` on (default: the scheduler's jobs, now)."""
        if counts is None:
            with self._lock:
                views = {**self._views, **self._inflight}
                open_gpus = [g for g in self._views if g not in self._inflight]
            unit_gpu = {k: g for g, v in views.items() for k in v.units}
            counts = resident_counts(self.scheduler.resident_jobs(), unit_gpu, open_gpus)
        with self._lock:
            self.meter.sample(now, counts)

    def refresh(self) -> dict[Gpu, GpuView]:
        """Reread the GPUs from the managers' reports (the views `sample` maps units with)."""
        views, skipped = read_gpus(self.scheduler.ds, self.gpu_model)
        now = self.clock()
        with self._lock:
            forbidden = dict(self._forbidden)
        for gpu, (until, why) in forbidden.items():
            if now < until and gpu in views:
                del views[gpu]
                skipped[gpu] = f"its manager may not change MIG geometry (403): {why}"
        for gpu, why in skipped.items():
            if self._skipped.get(gpu) != why:
                log.info("reconfigurator: leaving GPU %s/%d alone: %s", gpu[0], gpu[1], why)
        with self._lock:
            self._views, self._skipped = views, skipped
            # Alg. 2's thresholds over the slice sizes the managers report, not the nominal ones
            self.reconfigurator.slice_memory_mb = slice_memory(views.values())
        return views

    def _known(self, model: str | None) -> str | None:
        return model if model in self.models else None

    def observations(self, now: float) -> list[GpuObservation]:
        """Each GPU's observation over the interval that ends `now` (the meter starts the next one)."""
        views = self.refresh()
        with self._lock:
            means = self.meter.means(now)
            inflight = dict(self._inflight)
        out = []
        for gpu in sorted(set(views) | set(inflight)):
            view = inflight.get(gpu) or views[gpu]
            r = means.get(gpu, Residency())
            be_model = self._known(r.be_model)
            if be_model:
                self._be_model[gpu] = self._last_be_model = be_model
            be_model = be_model or self._be_model.get(gpu) or self._last_be_model
            out.append(
                GpuObservation(
                    gpu, view.geometry, r.best_effort, be_model, gpu in inflight, r.strict, self._known(r.strict_model)
                )
            )
        return out

    # -- decide -----------------------------------------------------------------------------
    def step(self, now: float) -> ReconfigDecision:
        """One monitor interval: observe every GPU, let Alg. 2 decide, start its reconfigurations
        and the retries of refused ones (within the 30% cap)."""
        obs = self.observations(now)
        decision = self.reconfigurator.observe(obs, now)
        todo = list(decision.reconfigure)
        with self._lock:
            self._targets = dict(decision.targets)
            inflight = set(self._inflight)
            views = dict(self._views)
            retries = dict(self._retry)
            not_before = dict(self._not_before)
        s = self.reconfigurator.settings
        for r in [r for r in todo if now < not_before.get(r.gpu, now)]:  # backing off: a retry later
            todo.remove(r)
            with self._lock:
                self._retry[r.gpu] = r.target
        slots = max(1, math.floor(s.max_fraction * len(obs))) - len(inflight) - len(todo)
        for gpu, target in retries.items():
            if gpu in inflight:
                continue
            if gpu not in views or decision.targets.get(gpu) != target or any(r.gpu == gpu for r in todo):
                with self._lock:
                    self._retry.pop(gpu, None)
                continue
            if slots <= 0 or now < not_before.get(gpu, now):
                continue
            slots -= 1
            with self._lock:
                self._retry.pop(gpu, None)
            log.info("reconfigurator: GPU %s/%d: trying %s again", gpu[0], gpu[1], ", ".join(target))
            todo.append(Reconfiguration(gpu, views[gpu].geometry, target, now, s.reconfig_s))
        for r in todo:
            self._launch(r, views[r.gpu])
        return decision

    # -- apply ------------------------------------------------------------------------------
    def _launch(self, r: Reconfiguration, view: GpuView) -> None:
        with self._lock:
            self._inflight[r.gpu] = view
        self.scheduler.hold_units(set(view.units))
        log.info(
            "reconfigurator: GPU %s/%d: (%s) -> (%s)", r.gpu[0], r.gpu[1], ", ".join(r.current), ", ".join(r.target)
        )
        if self.executor is None:
            self._apply(r, view)
        else:
            self.executor.submit(self._apply, r, view)

    def _apply(self, r: Reconfiguration, view: GpuView) -> None:
        node, index = r.gpu
        names = [self.gpu_model.profile(k).name for k in r.target]  # the manager takes NVML's names
        status, detail, retry, retry_after_s = "error", "", False, None
        try:
            status, detail, retry, retry_after_s = set_geometry(
                self.http, self.token, view.url, index, names, self.drain_timeout_s
            )
        except Exception as exc:  # never let one GPU's failure stop the controller
            status, detail = "error", repr(exc)[:300]
        finally:
            with self._lock:
                self._inflight.pop(r.gpu, None)
                self._after(r.gpu, status, detail, retry, retry_after_s)
                if retry:
                    self._retry[r.gpu] = r.target
                self.outcomes.append(Outcome(r.gpu, r.current, r.target, r.decided_at, status, detail))
            self.scheduler.release_units(set(view.units))
            try:
                self.scheduler.refresh_units()
                self.refresh()
            except Exception as exc:
                log.warning("reconfigurator: cannot reread the units: %s", exc)
        level = logging.INFO if status == "done" else logging.WARNING
        log.log(
            level,
            "reconfigurator: GPU %s/%d -> (%s): %s%s%s",
            node,
            index,
            ", ".join(r.target),
            status,
            f": {detail}" if detail and status != "done" else "",
            self._retry_note(r.gpu) if retry else "; not retried" if status == "forbidden" else "",
        )

    def _retry_note(self, gpu: Gpu) -> str:
        with self._lock:
            wait = self._not_before.get(gpu, 0.0) - self.clock()
        return "; trying again at the next decision" if wait <= 0 else f"; trying again in {wait:.0f}s at the earliest"

    def _after(self, gpu: Gpu, status: str, detail: str, retry: bool, retry_after_s: float | None) -> None:
        """The back-off after an answer (under the lock): a retry waits interval_s x (2^(n-1) - 1)
        after the n-th refusal in a row (the first at the next decision), at most max_backoff_s,
        and at least the manager's Retry-After; a 403 leaves the GPU alone for forbidden_s."""
        now = self.clock()
        if status == "forbidden":
            self._forbidden[gpu] = (now + self.forbidden_s, detail)
            self._refusals.pop(gpu, None)
            self._not_before.pop(gpu, None)
            return
        if not retry:
            self._refusals.pop(gpu, None)
            self._not_before.pop(gpu, None)
            return
        n = self._refusals[gpu] = self._refusals.get(gpu, 0) + 1
        delay = min(self.max_backoff_s, self.interval_s * (2 ** min(n - 1, 30) - 1))
        self._not_before[gpu] = now + max(delay, retry_after_s or 0.0)

    # -- status and the loop ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            gpus = {
                gpu_key(g): {
                    "geometry": list((self._inflight.get(g) or v).geometry),
                    "target": list(self._targets.get(g, ())),
                    "reconfiguring": g in self._inflight,
                    "retry": list(self._retry[g]) if g in self._retry else None,
                    "not_before": self._not_before.get(g),
                }
                for g, v in {**self._views, **self._inflight}.items()
            }
            return {
                "gpus": gpus,
                "left_alone": {gpu_key(g): why for g, why in self._skipped.items()},
                "recent": [
                    {
                        "gpu": gpu_key(o.gpu),
                        "from": list(o.current),
                        "to": list(o.target),
                        "status": o.status,
                        "detail": o.detail,
                    }
                    for o in self.outcomes
                ],
            }

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    close = stop

    def _restart(self, now: float) -> None:
        """A new term as leader: observations and Alg. 2's counters start afresh."""
        self.reconfigurator = Reconfigurator(self.reconfigurator.slowdown, self.reconfigurator.settings)
        with self._lock:
            self.meter = ResidencyMeter(now)
            self._retry.clear()
            self._refusals.clear()
            self._not_before.clear()

    def _run(self) -> None:
        leading = False
        next_step = 0.0
        while not self._stop.wait(self.sample_s):
            try:
                if not self.is_leader():
                    leading = False
                    continue
                now = self.clock()
                if not leading:
                    leading, next_step = True, now + self.interval_s
                    self._restart(now)
                    self.refresh()
                self.sample(now)
                if now >= next_step:
                    next_step = now + self.interval_s
                    self.step(now)
            except Exception:
                log.exception("reconfigurator: monitor round failed")
