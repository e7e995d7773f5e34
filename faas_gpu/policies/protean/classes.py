"""Request classes and the reordering queue (PROTEAN §4.1).

Every request is *strict* (it has a deadline: arrival + SLO) or *best-effort* (no deadline).
Strict requests are served first, earliest deadline first, so that a surge that finds too few
containers delays best-effort work rather than SLOs. Best-effort work is never starved for
ever: one that has waited longer than `be_max_wait_s` is served next, before any strict one.

`ClassQueue` is a plain data structure (two heaps, O(log n) push and pop) that takes the time
as an argument; the live scheduler and the simulator use the same one.

Clients choose a class per request with two headers (DESIGN: our additions are `X-Faas-Gpu-*`):
`X-Faas-Gpu-Class: strict | best-effort` and `X-Faas-Gpu-Slo-Ms: <positive number>`. They are
part of the cross-process contract and parsed there (`faas_gpu.contract.slo`, re-exported here);
`classify` adds the function's defaults.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from faas_gpu.contract import annotations as ann
from faas_gpu.contract.headers import CLASS as CLASS_HEADER
from faas_gpu.contract.headers import SLO_MS as SLO_HEADER
from faas_gpu.contract.slo import MAX_SLO_MS, RequestClass, parse_class, parse_slo_ms

__all__ = [
    "BE_MAX_WAIT_S",
    "BE_SHARE",
    "CLASS_HEADER",
    "MAX_SLO_MS",
    "SLO_HEADER",
    "ClassQueue",
    "Queued",
    "RequestClass",
    "RequestClassChoice",
    "admission_queue",
    "admit",
    "classify",
    "parse_class",
    "parse_slo_ms",
]

T = TypeVar("T")

BE_MAX_WAIT_S = 5.0
"""How long a best-effort job waits behind strict ones before it is served (the live scheduler's
`--be-max-wait` default, and `ClassQueue`'s). The simulator reads its own value from the scenario's
assumptions (`assumptions.yaml`, `policy.be_max_wait_s`, 1 s as PROTEAN's runs), so its figures stay
those of the paper's setting."""
BE_SHARE = 0.25
"""Past BE_MAX_WAIT_S, the share of admissions overdue best-effort jobs take from waiting strict
ones in the live scheduler (`--be-share`); `ClassQueue` alone defaults to no cap (1.0)."""


@dataclass(frozen=True)
class RequestClassChoice:
    request_class: RequestClass
    slo_ms: float | None  # None for best-effort

    def deadline(self, arrival_s: float) -> float | None:
        return None if self.slo_ms is None else arrival_s + self.slo_ms / 1000.0


def classify(
    headers: Mapping[str, str],
    default_class: RequestClass = RequestClass.STRICT,
    default_slo_ms: float | None = None,
) -> RequestClassChoice:
    """A request's class and SLO from its headers (case-insensitive names) and the function's defaults.

    A strict request needs an SLO (header or default); a best-effort one ignores any SLO given.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    cls = parse_class(lower.get(CLASS_HEADER.lower())) or default_class
    slo = parse_slo_ms(lower.get(SLO_HEADER.lower()))
    if cls is RequestClass.BEST_EFFORT:
        return RequestClassChoice(cls, None)
    slo = slo if slo is not None else default_slo_ms
    if slo is None:
        raise ValueError(f"{SLO_HEADER}: a strict request needs an SLO (the header, or the function's {ann.SLO_MS})")
    return RequestClassChoice(cls, slo)


@dataclass(frozen=True)
class Queued(Generic[T]):
    item: T
    arrival: float
    deadline: float | None  # None: best-effort

    @property
    def strict(self) -> bool:
        return self.deadline is not None


class ClassQueue(Generic[T]):
    """Strict first (earliest deadline first), best-effort FIFO behind them, with a bound on BE waiting.

    `pop(now)` serves the oldest best-effort entry if it has waited more than `be_max_wait_s`,
    else the strict entry with the earliest deadline, else the oldest best-effort entry.
    `be_share` < 1 caps what overdue best-effort work takes while strict work waits: of the pops
    made while both wait, at most that share go to best-effort ones (a deficit counter), so an
    overload that outlasts the bound cannot hand strict work's capacity to best-effort work, and
    best-effort work still always progresses. Ties keep insertion order. push and pop are O(log n).
    """

    def __init__(self, be_max_wait_s: float = BE_MAX_WAIT_S, be_share: float = 1.0):
        if not be_max_wait_s > 0:
            raise ValueError(f"be_max_wait_s: must be > 0, got {be_max_wait_s}")
        if not 0 < be_share <= 1:
            raise ValueError(f"be_share: must be in (0, 1], got {be_share}")
        self.be_max_wait_s = be_max_wait_s
        self.be_share = be_share
        self._credit = 1.0  # best-effort pops owed while both classes wait (be_share < 1)
        self._strict: list[tuple[float, int, Queued[T]]] = []
        self._be: list[tuple[float, int, Queued[T]]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._strict) + len(self._be)

    def __bool__(self) -> bool:
        return bool(self._strict or self._be)

    @property
    def strict_count(self) -> int:
        return len(self._strict)

    @property
    def best_effort_count(self) -> int:
        return len(self._be)

    def push(self, item: T, now: float, deadline: float | None = None) -> None:
        """Enqueue `item` arrived at `now`; `deadline` None makes it best-effort."""
        entry = Queued(item, now, deadline)
        if deadline is None:
            heapq.heappush(self._be, (now, next(self._seq), entry))
        else:
            heapq.heappush(self._strict, (deadline, next(self._seq), entry))

    def push_entry(self, entry: Queued[T]) -> None:
        """Put back an entry taken with `pop_entry`, keeping its arrival and deadline."""
        heap, key = (self._be, entry.arrival) if entry.deadline is None else (self._strict, entry.deadline)
        heapq.heappush(heap, (key, next(self._seq), entry))

    def _overdue(self, now: float) -> bool:
        return bool(self._be) and now - self._be[0][2].arrival > self.be_max_wait_s

    def _next_heap(self, now: float) -> list[tuple[float, int, Queued[T]]]:
        if self._be and (not self._strict or (self._overdue(now) and self._credit >= 1.0)):
            return self._be
        if self._strict:
            return self._strict
        raise IndexError("pop from an empty ClassQueue")

    def peek_entry(self, now: float) -> Queued[T]:
        return self._next_heap(now)[0][2]

    def pop_entry(self, now: float) -> Queued[T]:
        heap = self._next_heap(now)
        if self.be_share < 1.0 and self._strict and self._overdue(now):  # both wait: keep the share
            if heap is self._be:
                self._credit -= 1.0
            else:
                self._credit += self.be_share / (1.0 - self.be_share)
        return heapq.heappop(heap)[2]

    def pop_class(self, strict: bool) -> Queued[T]:
        """The next entry of one class only: the earliest deadline, or the oldest best-effort entry."""
        heap = self._strict if strict else self._be
        if not heap:
            raise IndexError(f"no {'strict' if strict else 'best-effort'} entry in the ClassQueue")
        return heapq.heappop(heap)[2]

    def remove(self, item: T) -> bool:
        """Take `item` out wherever it waits (a caller that left, a deadline passed); O(n)."""
        for heap in (self._strict, self._be):
            for i, (_, _, e) in enumerate(heap):
                if e.item is item:
                    heap[i] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    return True
        return False

    def pop(self, now: float) -> T:
        return self.pop_entry(now).item

    def peek(self, now: float) -> T:
        return self.peek_entry(now).item

    def entries(self) -> Iterator[Queued[T]]:
        """Every entry, in no particular order (the queue is left as it is)."""
        for _, _, e in self._strict:
            yield e
        for _, _, e in self._be:
            yield e

    def drain(self, now: float) -> Iterator[Queued[T]]:
        """Every entry in serving order at `now` (the queue is emptied)."""
        while self:
            yield self.pop_entry(now)


def admission_queue(be_max_wait_s: float = BE_MAX_WAIT_S, be_share: float = BE_SHARE) -> ClassQueue[T]:
    """The class queue of PROTEAN's admission, as the scheduler daemon (`scheduler.admission`) and the
    simulator (`faas_gpu.sim.protean`) both build it: one place, so the two run the same queue with
    the same bound on best-effort waiting and the same `be_share` (`ClassQueue` alone defaults to
    no share cap; admission always has one)."""
    return ClassQueue(be_max_wait_s, be_share)


def admit(queue: ClassQueue[T], now: float, room: Callable[[], bool]) -> Iterator[Queued[T]]:
    """Admission in the queue's serving order at `now` while the placement has `room` (asked
    before each entry): the one rule for what placement sees next, in the daemon and the simulator.

    Every entry yielded is taken off the queue and counts against `be_share`; one the caller
    cannot place after all goes back with `push_entry` (its arrival and deadline kept).
    """
    while queue and room():
        yield queue.pop_entry(now)
