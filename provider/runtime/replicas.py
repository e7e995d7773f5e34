"""The supervisor's bookkeeping for one function: its replicas, failures, back-off and plan,
and the reconciliation of what runs with what the record (or the plan) asks for.

Kept apart from starting processes so the rules (roll a new version out as a Kubernetes
Deployment does, one replica per planned instance, back off a failing function, call it
crash-looping or its rollout stalled) read without the system calls.

A rollout, as a Deployment's default RollingUpdate strategy (maxSurge 25%, maxUnavailable 25%):
at most ceil(25%) replicas above the desired count while it runs, and never fewer ready ones
than the desired count less floor(25%) (for 1 to 3 replicas: one new replica at a time, an old
one stopped only once a new one is ready). A version whose replicas never become ready (a handler
that raised at import, a crash loop, a spec that cannot start) does not take over: the previous
version's replicas serve on, and the rollout is reported stalled with the new replicas' error.

A replica of the current version can be `superseded` (one exec'd only because the fork server
was starting, `local`): it is replaced as an older version's replica is, by the same bounds, but
it is no rollout (`stale`, `rollout` and describe count versions only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..types import FunctionRecord
from .base import InstanceSpec
from .launch import LaunchSpec
from .processes import Replica

MAX_BACKOFF_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 35.0  # the default write_timeout (30 s) and 5 s to exit
CRASH_LOOP_EXITS = 3
"""Exits in a row without a replica becoming ready: the function is crash-looping and
requests get a prompt 503 instead of waiting for a replica that will not come."""
CRASH_LOOPING = "CrashLooping"
START_FAILED = "StartFailed"
MAX_SURGE = 0.25
MAX_UNAVAILABLE = 0.25
"""A Deployment's default RollingUpdate bounds, as fractions of the desired replicas."""
PROGRESS_DEADLINE_S = 600.0
"""A Deployment's default progressDeadlineSeconds: a rollout without a ready new replica for
this long is stalled even when nothing has failed yet."""
PROGRESSING = "Progressing"
STALLED = "Stalled"
SERVED_SPECS_KEPT = 2

Start = Callable[[InstanceSpec | None, str | None], bool]
"""Start one replica (of a planned instance, with its digest); False when it failed."""


def backoff_s(failures: int) -> float:
    """0.5 s after the first failure, doubling, at most MAX_BACKOFF_S."""
    return min(MAX_BACKOFF_S, 0.5 * 2 ** min(max(failures - 1, 0), 16))


@dataclass
class FunctionReplicas:
    record: FunctionRecord
    spec: LaunchSpec | None
    """None while the record does not plan (missing image or secret): retried with back-off."""
    replicas: list[Replica] = field(default_factory=list)
    failures: int = 0
    """Failed starts and exits since a replica last became ready: the back-off's exponent."""
    exits: int = 0
    """Replica exits since a replica last became ready: the crash-loop count."""
    next_start: float = 0.0
    plan: list[InstanceSpec] | None = None
    """When set, the replicas are exactly these instances (and record.replicas is ignored)."""
    start_error: str | None = None
    """Why the last attempt to plan or start a replica failed (cleared by the next success)."""
    load_error: str | None = None
    """Why the current version's last replica said it cannot become ready (its readiness check
    answered 500: a handler that raised at import); cleared when one of that version is ready."""
    served: bool = False
    """A replica of the version last applied has been ready."""
    rollout_started: float | None = None
    """When replicas of an older version were first seen beside the current spec (None: settled)."""
    served_specs: dict[str, Any] = field(default_factory=dict)
    """Deployment (canonical JSON) -> the spec its replicas ran when they served, the last few:
    deploying that deployment again while they still run goes back to them, even when the image
    store's tag now names another build (`faas-gpu rollback`)."""

    # -- versions ------------------------------------------------------------------------
    def digests_of(self, spec: Any) -> set[str]:
        """The digests replicas of `spec` carry (one per planned instance, else the spec's)."""
        if spec is None:
            return set()
        if self.plan is not None:
            return {inst.digest(spec.digest) for inst in self.plan}
        return {spec.digest}

    def current(self) -> list[Replica]:
        digests = self.digests_of(self.spec)
        return [r for r in self.replicas if r.digest in digests]

    def stale(self) -> list[Replica]:
        """Replicas of an earlier version (or of instances a plan no longer has)."""
        digests = self.digests_of(self.spec)
        return [r for r in self.replicas if r.digest not in digests]

    def remember_served(self) -> None:
        """The current spec served: keep it for a return to this deployment (`served_specs`)."""
        self.served = True
        if self.spec is None:
            return
        key = deployment_key(self.record)
        self.served_specs.pop(key, None)
        self.served_specs[key] = self.spec
        while len(self.served_specs) > SERVED_SPECS_KEPT:
            self.served_specs.pop(next(iter(self.served_specs)))

    def _failure(self) -> str | None:
        """Why the current version does not serve, when it has said so."""
        if self.start_error is not None:
            return self.start_error
        if self.load_error is not None:
            return self.load_error
        if self.exits >= CRASH_LOOP_EXITS:
            return f"its replicas exited {self.exits} times in a row before serving"
        return None

    @property
    def problem(self) -> dict[str, str] | None:
        """The function's faas-gpu state when it cannot serve for a reason of its own. While a
        previous version's replicas serve, the new version's trouble is its rollout's (`rollout`)."""
        if any(r.ready for r in self.stale()):
            return None
        ref = f"{self.record.name}.{self.record.namespace}"
        if self.start_error is not None:
            return {"state": START_FAILED, "message": self.start_error}
        if self.load_error is not None and not any(r.ready for r in self.replicas):
            return {
                "state": START_FAILED,
                "message": (
                    f"function {ref} did not become ready: {self.load_error}; see "
                    f"`faas-gpu logs {self.record.name}` or /system/logs?name={ref}"
                ),
            }
        if self.exits >= CRASH_LOOP_EXITS and not any(r.ready for r in self.replicas):
            return {
                "state": CRASH_LOOPING,
                "message": (
                    f"function {ref} is crash-looping: its replicas exited {self.exits} times in a row "
                    f"before serving; see `faas-gpu logs {self.record.name}` or /system/logs?name={ref}"
                ),
            }
        return None

    def rollout(self, now: float) -> dict[str, Any] | None:
        """The rollout under way (Kubernetes' Progressing condition), or None once settled: the
        new version's ready replicas, the old ones still running, and, once stalled, why."""
        stale = self.stale()
        if not stale:
            return None
        current = self.current()
        want = len(self.plan) if self.plan is not None else max(self.record.replicas, 0)
        old_ready = sum(r.ready for r in stale)
        why = self._failure()
        if why is None and self.rollout_started is not None and now - self.rollout_started > PROGRESS_DEADLINE_S:
            why = f"no new replica became ready within {PROGRESS_DEADLINE_S:.0f}s"
        out: dict[str, Any] = {
            "state": STALLED if why is not None else PROGRESSING,
            "replicas": want,
            "updatedReplicas": len(current),
            "readyUpdatedReplicas": sum(r.ready for r in current),
            "oldReplicas": len(stale),
            "readyOldReplicas": old_ready,
        }
        if why is None:
            out["message"] = f"{out['readyUpdatedReplicas']} of {want} new replicas ready; {old_ready} old serving"
        else:
            serving = f"{old_ready} replica{'s' if old_ready != 1 else ''} of the previous version serve on"
            out["message"] = (
                f"the new version's replicas are not ready: {why}; {serving}; `faas-gpu rollback "
                f"{self.record.name}` (or deploying the previous spec again) restores it at once"
            )
        return out

    @property
    def stop_timeout_s(self) -> float:
        return self.spec.stop_timeout_s if self.spec is not None else DEFAULT_STOP_TIMEOUT_S


def deployment_key(record: FunctionRecord) -> str:
    """A deployment as one comparable string (what `served_specs` is keyed by)."""
    return json.dumps(record.deployment.to_json(), sort_keys=True)


def rolling_bounds(want: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in replicas for `want` desired, as a Deployment rounds its 25%s:
    surge up, unavailable down; never both 0 (Kubernetes refuses that), so a rollout can move."""
    surge = math.ceil(want * MAX_SURGE)
    unavailable = math.floor(want * MAX_UNAVAILABLE)
    if surge == 0 and unavailable == 0 and want > 0:
        surge = 1
    return surge, unavailable


def reconcile_count(fn: FunctionReplicas, now: float, start: Start) -> list[Replica]:
    """Match record.replicas, rolling a new spec out as a Deployment does (`rolling_bounds`):
    new replicas first, within maxSurge; an old one stopped only while the ready ones stay at
    least the desired count less maxUnavailable (an old replica that is not ready goes first).
    Kubernetes' `reconcileNewReplicaSet` / `reconcileOldReplicaSets`, one function's worth."""
    assert fn.spec is not None
    want = max(fn.record.replicas, 0)
    surge, unavailable = rolling_bounds(want)
    current = [r for r in fn.current() if not r.superseded]
    stale = fn.stale() + [r for r in fn.current() if r.superseded]  # replaced as an older version's are
    to_stop: list[Replica] = []
    extra = len(current) - want
    if extra > 0:
        dropped = sorted(current, key=lambda r: (r.ready, r.started))[:extra]
        to_stop += dropped
        current = [r for r in current if r not in dropped]
    if stale:
        total = len(current) + len(stale)
        scale_down = total - (want - unavailable) - sum(not r.ready for r in current)
        for r in sorted(stale, key=lambda r: (r.ready, r.started)):  # the ones not serving first
            if scale_down <= 0:
                break
            to_stop.append(r)
            scale_down -= 1
        stale = [r for r in stale if r not in to_stop]
    detach(fn, to_stop)
    missing = min(want + surge - len(current) - len(stale), want - len(current))
    if missing > 0 and now >= fn.next_start:
        for _ in range(missing):
            if not start(None, None):
                break
    return to_stop


def reconcile_plan(fn: FunctionReplicas, now: float, start: Start) -> list[Replica]:
    """One replica per planned instance; a changed instance is replaced once its successor serves."""
    assert fn.plan is not None and fn.spec is not None
    want = {inst.id: inst for inst in fn.plan}
    digests = {inst.id: inst.digest(fn.spec.digest) for inst in fn.plan}
    by_slot: dict[str, list[Replica]] = {}
    leaving = [r for r in fn.replicas if r.slot not in want]
    serving = {r.slot for r in fn.replicas if r.ready and r.slot in want and r.digest == digests[r.slot]}
    # instances dropped from the plan serve until every planned one does (no gap in a re-plan)
    to_stop = leaving if serving >= set(want) or not any(r.ready for r in leaving) else []
    for r in fn.replicas:
        if r.slot in want:
            by_slot.setdefault(r.slot, []).append(r)
    for slot, inst in want.items():
        mine = by_slot.get(slot, [])
        current = [r for r in mine if r.digest == digests[slot] and not r.superseded]
        old = [r for r in mine if r not in current]
        if old and current and current[0].ready:  # its successor serves (else the old one serves on)
            to_stop += old
        if not current and now >= fn.next_start and not start(inst, digests[slot]):
            break
    detach(fn, to_stop)
    return to_stop


def detach(fn: FunctionReplicas, to_stop: list[Replica]) -> None:
    for r in to_stop:
        r.stopping = True
        if r in fn.replicas:
            fn.replicas.remove(r)


def reason(exc: BaseException) -> str:
    """One line for describe and the logs (an OSError's path can be kilobytes long)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 500 else text[:500] + "…"
