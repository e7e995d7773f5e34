"""PROTEAN's GPU Reconfigurator, live (§4.4, Alg. 2): the scheduler leader re-slices MIG GPUs.

The decision is the pure `Reconfigurator` the simulator measures; this controller only feeds it
and applies what it returns:
- *observe*: every `sample_s` it counts the jobs resident per GPU (a GPU = node + GPU index):
  running on or queued in the local queue of one of its MIG units, best-effort and strict apart,
  with their models (`X-Faas-Gpu-Model`). Jobs still in the global queues could go to any GPU,
  so each GPU counts an equal share of them. `ResidencyMeter` turns the samples into the mean
  over the monitor interval W, and the best-effort model resident the longest is the GPU's BE
  model (the last one seen, while a GPU has none).
- *decide*: every W it calls `Reconfigurator.observe(observations, now)`; the policy's EWMA,
  wait limit (3 similar mismatches) and 30%-of-GPUs cap apply.
- *apply*: for each `Reconfiguration` it holds the GPU's units in the scheduler (nothing new is
  placed there), calls the GPU's manager, `POST /v1/gpus/<i>/geometry` (which drains the units,
  re-slices the GPU and reports the new units), then releases the hold and rereads the units.
  A refusal (409: units did not drain; 5xx) or a manager that does not answer is logged and tried
  again at the next decision, if the policy still wants that geometry and the cap allows; a 400
  (the manager cannot take the geometry) is logged and left to the policy's next decision.

Only MIG units whose GPU is the assumptions file's GPU model (A100-40GB by default) are
managed: units report their MIG profile and GPU name (the GPU Managers' status reports). Jobs whose model is
not in the assumptions file count as resident jobs, but only a known model gives BE memory.
Only the scheduler leader acts; a new leader starts its observations afresh.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import requests

from faas_gpu.contract.keys import UNITS as STATUS_PREFIX
from faas_gpu.datastore import Datastore
from faas_gpu.policies.protean.mig import Geometry, GpuModel, InvalidGeometry
from faas_gpu.policies.protean.reconfigurator import (
    GpuObservation,
    ReconfigDecision,
    Reconfiguration,
    Reconfigurator,
)

log = logging.getLogger(__name__)

Gpu = tuple[str, int]  # (node, GPU index)
CountKey = tuple[Gpu, bool, str | None]  # (GPU, best-effort, model)


# -- observations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Residency:
    """Mean jobs resident on one GPU over a monitor interval, and the models resident the longest."""

    best_effort: float = 0.0
    strict: float = 0.0
    be_model: str | None = None
    strict_model: str | None = None


class ResidencyMeter:
    """Time-weighted means of resident job counts between two reads (Alg. 2's monitor interval).

    `sample(now, counts)`: from `now` on the counts are these (the previous ones held until
    then). `means(now)`: the mean of each GPU's counts since the last read; the read starts the
    next interval.
    """

    def __init__(self, start: float = 0.0):
        self._since = self._last = start
        self._counts: dict[CountKey, float] = {}
        self._area: dict[CountKey, float] = defaultdict(float)

    def sample(self, now: float, counts: Mapping[CountKey, float]) -> None:
        self._advance(now)
        self._counts = {k: float(v) for k, v in counts.items() if v}

    def _advance(self, now: float) -> None:
        dt = now - self._last
        if dt > 0:
            for k, v in self._counts.items():
                self._area[k] += v * dt
            self._last = now

    def means(self, now: float) -> dict[Gpu, Residency]:
        self._advance(now)
        span = self._last - self._since
        values = {k: a / span for k, a in self._area.items()} if span > 0 else dict(self._counts)
        self._area = defaultdict(float)
        self._since = self._last
        totals: dict[Gpu, list[float]] = defaultdict(lambda: [0.0, 0.0])
        by_model: dict[tuple[Gpu, bool], dict[str, float]] = defaultdict(dict)
        for (gpu, best_effort, model), v in values.items():
            totals[gpu][0 if best_effort else 1] += v
            if model is not None:
                by_model[(gpu, best_effort)][model] = by_model[(gpu, best_effort)].get(model, 0.0) + v

        def top(gpu: Gpu, best_effort: bool) -> str | None:
            models = by_model.get((gpu, best_effort))
            return max(sorted(models), key=lambda m: models[m]) if models else None

        return {g: Residency(be, st, top(g, True), top(g, False)) for g, (be, st) in totals.items()}


def resident_counts(
    jobs: Iterable[tuple[str | None, bool, str | None]], unit_gpu: Mapping[str, Gpu], gpus: Iterable[Gpu]
) -> dict[CountKey, float]:
    """Jobs (node/unit key or None, best-effort, model) → counts per (GPU, best-effort, model).

    A job on a unit counts for that unit's GPU (units of GPUs not managed here are left out); a
    job in the global queues counts 1/n for each of the n GPUs it may still go to (`gpus`).
    """
    spread = sorted(set(gpus))
    share = 1.0 / len(spread) if spread else 0.0
    out: dict[CountKey, float] = defaultdict(float)
    for key, best_effort, model in jobs:
        if key is None:
            for g in spread:
                out[(g, best_effort, model)] += share
        elif key in unit_gpu:
            out[(unit_gpu[key], best_effort, model)] += 1.0
    return dict(out)


# -- the GPUs, from the managers' unit reports ----------------------------------------------


@dataclass(frozen=True)
class GpuView:
    gpu: Gpu
    url: str  # its GPU Manager
    units: tuple[str, ...]  # node/unit keys of its MIG units
    geometry: Geometry  # profile keys, largest first: ("4g", "2g", "1g")


def gpu_name_matches(model: str, gpu_name: str | None) -> bool:
    """ "A100-40GB" matches NVML's "NVIDIA A100-SXM4-40GB": every part of the model name is in it."""
    if not gpu_name:
        return False
    name = gpu_name.upper()
    return all(part in name for part in model.upper().split("-") if part)


def read_gpus(ds: Datastore, gpu_model: GpuModel) -> tuple[dict[Gpu, GpuView], dict[Gpu, str]]:
    """The MIG GPUs of `gpu_model` the managers report units of, and why the other GPUs are left out."""
    reports = []
    for kv in ds.get_prefix(STATUS_PREFIX):
        try:
            reports.append(json.loads(kv.value))
        except ValueError:
            continue
    return gpu_views(reports, gpu_model)


def gpu_views(reports: Iterable[Any], gpu_model: GpuModel) -> tuple[dict[Gpu, GpuView], dict[Gpu, str]]:
    """`read_gpus` over unit reports already read (parsed JSON; malformed ones are skipped)."""
    units: dict[Gpu, list[dict[str, Any]]] = defaultdict(list)
    for s in reports:
        try:
            if s.get("kind") == "mig":
                units[(str(s["node"]), int(s["gpu"]))].append(s)
        except (AttributeError, ValueError, KeyError, TypeError):
            continue
    views: dict[Gpu, GpuView] = {}
    skipped: dict[Gpu, str] = {}
    for gpu, reports in units.items():
        names = {r.get("gpu_name") for r in reports}
        if len(names) != 1 or not gpu_name_matches(gpu_model.name, names.pop()):
            skipped[gpu] = f"not an {gpu_model.name} (reports {sorted(map(str, {r.get('gpu_name') for r in reports}))})"
            continue
        if any(not r.get("profile") for r in reports) or len({r.get("url") for r in reports}) != 1:
            skipped[gpu] = "its units report no MIG profile or several managers"
            continue
        try:
            geometry = gpu_model.validate([r["profile"] for r in reports])
        except InvalidGeometry as exc:
            skipped[gpu] = str(exc).split(". Valid")[0]
            continue
        keys = tuple(sorted(f"{r['node']}/{r['unit']}" for r in reports))
        views[gpu] = GpuView(gpu, str(reports[0]["url"]), keys, geometry)
    return views, skipped


# -- the controller -------------------------------------------------------------------------


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
        for gpu, why in skipped.items():
            if self._skipped.get(gpu) != why:
                log.info("reconfigurator: leaving GPU %s/%d alone: %s", gpu[0], gpu[1], why)
        with self._lock:
            self._views, self._skipped = views, skipped
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
        s = self.reconfigurator.settings
        slots = max(1, math.floor(s.max_fraction * len(obs))) - len(inflight) - len(todo)
        for gpu, target in retries.items():
            if gpu in inflight:
                continue
            if gpu not in views or decision.targets.get(gpu) != target or any(r.gpu == gpu for r in todo):
                with self._lock:
                    self._retry.pop(gpu, None)
                continue
            if slots <= 0:
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
        body = {"profiles": names, "drain_timeout_s": self.drain_timeout_s}
        status, detail, retry = "error", "", False
        try:
            resp = self.http.post(
                f"{view.url}/v1/gpus/{index}/geometry",
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=self.drain_timeout_s + 60,
            )
            detail = resp.text.strip()[:300]
            if resp.status_code == 200:
                status = "done"
            elif resp.status_code == 400:
                status = "invalid"
            elif resp.status_code == 409 or resp.status_code >= 500:
                status, retry = "refused", True
            else:
                status = "error"
        except requests.RequestException as exc:
            status, detail, retry = "unreachable", str(exc)[:300], True
        except Exception as exc:  # never let one GPU's failure stop the controller
            status, detail = "error", repr(exc)[:300]
        finally:
            with self._lock:
                self._inflight.pop(r.gpu, None)
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
            "; trying again at the next decision" if retry else "",
        )

    # -- status and the loop ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            gpus = {
                gpu_key(g): {
                    "geometry": list((self._inflight.get(g) or v).geometry),
                    "target": list(self._targets.get(g, ())),
                    "reconfiguring": g in self._inflight,
                    "retry": list(self._retry[g]) if g in self._retry else None,
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


def gpu_key(gpu: Gpu) -> str:
    return f"{gpu[0]}/{gpu[1]}"
