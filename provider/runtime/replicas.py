"""The supervisor's bookkeeping for one function: its replicas, failures, back-off and plan,
and the reconciliation of what runs with what the record (or the plan) asks for.

Kept apart from starting processes so the rules (replace stale replicas once new ones serve,
one replica per planned instance, back off a failing function, call it crash-looping) read
without the system calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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

    @property
    def problem(self) -> dict[str, str] | None:
        """The function's faas-gpu state when it cannot serve for a reason of its own."""
        if self.start_error is not None:
            return {"state": START_FAILED, "message": self.start_error}
        if self.exits >= CRASH_LOOP_EXITS and not any(r.ready for r in self.replicas):
            ref = f"{self.record.name}.{self.record.namespace}"
            return {
                "state": CRASH_LOOPING,
                "message": (
                    f"function {ref} is crash-looping: its replicas exited {self.exits} times in a row "
                    f"before serving; see `faas-gpu logs {self.record.name}` or /system/logs?name={ref}"
                ),
            }
        return None

    @property
    def stop_timeout_s(self) -> float:
        return self.spec.stop_timeout_s if self.spec is not None else DEFAULT_STOP_TIMEOUT_S


def reconcile_count(fn: FunctionReplicas, now: float, start: Start) -> list[Replica]:
    """Replace replicas of an old spec (new ones first), then match record.replicas."""
    assert fn.spec is not None
    to_stop: list[Replica] = []
    stale = [r for r in fn.replicas if r.digest != fn.spec.digest]
    current = [r for r in fn.replicas if r.digest == fn.spec.digest]
    want = fn.record.replicas
    if stale and (all(r.ready for r in current) or not current) and len(current) >= min(want, 1):
        to_stop += stale
    extra = len(current) - want
    if extra > 0:
        to_stop += sorted(current, key=lambda r: (r.ready, r.started))[:extra]
    detach(fn, to_stop)
    if len(current) < want and now >= fn.next_start:
        for _ in range(want - len(current)):
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
        current = [r for r in mine if r.digest == digests[slot]]
        old = [r for r in mine if r.digest != digests[slot]]
        if old and (not current or current[0].ready):
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
