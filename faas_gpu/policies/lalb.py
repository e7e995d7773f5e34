"""Placement of inference jobs on GPU units: LB, LALB and LALB-O3 (GPU-FaaS paper, §IV).

- `LBScheduler`: the baseline — whenever a unit is idle, it takes the head of the global queue.
- `LALBScheduler`: locality-aware load balancing, Algorithm 1 (`_serve`) and Algorithm 2
  (`_locality_load_balance`), with out-of-order dispatch bounded by a skip limit (`o3_limit`,
  default 25; 0 is plain LALB).

The schedulers are pure state machines: the driver (the simulator, or the scheduler daemon)
calls `submit(request, now)`, `schedule(now)` and `complete(unit_id, now)` and applies the
returned `Dispatch` decisions. They never read a clock or touch the network.

Cost: the auxiliary index of §V — queued requests linked per model, units per cached model —
makes a placement cost proportional to the models cached on a unit and the units caching a
model, not to the queue length. Skip counts ("visits") are kept implicitly: every skip event
covers a prefix of the global queue, so visits never increase along the queue, and only the
head's count is ever needed; it is the number of recorded skip boundaries above its sequence
number (a heap).

Unit preference (`unit_preference`, default None: the papers' policies as they are): a pure
callable the driver may set, asked `(request, idle units)` whenever a request's unit is chosen
among idle units. It returns the ids of the idle units it wants the request on, all equally
good to it, or None when it has no opinion. Precedence: the preference first, cache locality
second. A request it has an opinion on runs on one of the units it named: a unit that caches
the model (a hit) if there is one, else the unit being served, else the least dispatched.
Such a request is never parked in a busy unit's local queue (Alg. 2, lines 8-14), and an idle
unit takes a cached request out of order only where the preference accepts that unit (checked
on each model's oldest request). A preference that names no idle unit counts as no opinion.
PROTEAN's Job Distribution (Alg. 1) over MIG slices is one such preference
(`faas_gpu.policies.lalb_job_distribution`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from .model_cache import ModelCache, ModelTooLarge


@dataclass(frozen=True)
class Model:
    """A model as profiled (Table I): GPU memory at the batch size, load and inference time."""

    name: str
    size_mb: float
    load_s: float
    infer_s: float


@dataclass
class Request:
    """One inference job (a batch for one model) waiting for a unit."""

    id: int
    model: str
    arrival: float
    seq: int = -1


@dataclass(frozen=True)
class Dispatch:
    """A decision: run `request` on `unit` now; a miss loads the model first (after evictions)."""

    request: Request
    unit: int
    hit: bool
    false_miss: bool
    evicted: tuple[str, ...]
    start: float
    duration: float


@dataclass
class Unit:
    """A GPU or a MIG slice: memory (the model cache), a local queue, a running job."""

    id: int
    cache: ModelCache
    node: int = 0
    running: Request | None = None
    busy_until: float = 0.0
    local_queue: deque[Request] = field(default_factory=deque)
    queued_work_s: float = 0.0
    dispatches: int = 0

    @property
    def idle(self) -> bool:
        return self.running is None


class PlacementError(ValueError):
    pass


# the paper's order by frequency among idle units: least dispatched first, then by id (unique, so
# the order never depends on how the idle units were listed)
_BY_DISPATCHES = attrgetter("dispatches", "id")

_BY_ESTIMATE: Callable[[tuple[Unit, float]], tuple[float, int]] = lambda pair: (pair[1], pair[0].id)  # noqa: E731

UnitPreference = Callable[[Request, Sequence[Unit]], Collection[int] | None]
"""(request, idle units) -> the ids of the idle units wanted for it, all equally good; None: no opinion."""


class _Base:
    unit_preference: UnitPreference | None = None
    # a driver that feeds the policy from its own queue (the scheduler's class queue) should let it
    # see this many model load times of queued work per unit: LALB spreads a busy model only once
    # the holders' backlog reaches the load time; LB needs no backlog
    lookahead_loads = 0.0

    def __init__(self, units: list[Unit], models: dict[str, Model]):
        if not units:
            raise PlacementError("units: at least one unit is needed")
        self.units = {u.id: u for u in units}
        self.models = dict(models)
        largest = max(u.cache.capacity_mb for u in units)
        for m in self.models.values():
            if m.size_mb > largest:
                raise PlacementError(f"models.{m.name}.size_mb: {m.size_mb} MB exceeds every unit ({largest} MB)")
        self.queue: OrderedDict[int, Request] = OrderedDict()  # global queue, by arrival
        self._next_seq = 0
        # units per cached model (the Cache Manager's lists, §V)
        self.holders: dict[str, set[int]] = {}
        self.idle: set[int] = {u.id for u in units if u.idle}

    # -- driver API ----------------------------------------------------------------------
    def add_model(self, model: Model) -> None:
        """Teach the policy a model (or its newly measured times) before requests use it."""
        largest = max(u.cache.capacity_mb for u in self.units.values())
        if model.size_mb > largest:
            raise PlacementError(f"models.{model.name}.size_mb: {model.size_mb} MB exceeds every unit ({largest} MB)")
        self.models[model.name] = model

    def submit(self, request: Request, now: float) -> None:
        if request.model not in self.models:
            raise PlacementError(f"model: {request.model!r} is not in the catalog")
        request.seq = self._next_seq
        self._next_seq += 1
        self.queue[request.seq] = request
        self._enqueued(request)

    def complete(self, unit_id: int, now: float) -> Request:
        unit = self.units[unit_id]
        done = unit.running
        if done is None:
            raise PlacementError(f"unit {unit_id} has no running job")
        unit.running = None
        unit.busy_until = now
        self.idle.add(unit_id)
        return done

    def withdraw(self, request_id: int) -> Request | None:
        """Take a queued request out (global or local queue) before it is dispatched: its caller
        left or its deadline passed. None when it is not queued (running, done, or unknown)."""
        for seq, request in self.queue.items():
            if request.id == request_id:
                del self.queue[seq]
                self._withdrawn(request)
                return request
        for unit in self.units.values():
            for request in unit.local_queue:
                if request.id == request_id:
                    unit.local_queue.remove(request)
                    unit.queued_work_s -= self.models[request.model].infer_s
                    return request
        return None

    def unload(self, unit_id: int, model: str) -> None:
        """The unit's manager does not hold `model` after all (it did not fit there even alone):
        out of the unit's modelled cache and of the model's holders, so locality stops sending it there."""
        unit = self.units[unit_id]
        if model in unit.cache:
            unit.cache.evict(model)
        self.holders.get(model, set()).discard(unit_id)

    def queued(self) -> int:
        return len(self.queue) + sum(len(u.local_queue) for u in self.units.values())

    def queued_work_s(self) -> float:
        """Inference time of every queued request (global and local queues), as profiled."""
        waiting = [*self.queue.values(), *(r for u in self.units.values() for r in u.local_queue)]
        return sum(self.models[r.model].infer_s for r in waiting)

    def idle_order(self) -> list[Unit]:
        """Idle units, least often dispatched to first, then by id (the paper's order by frequency)."""
        units = self.units
        return sorted([units[i] for i in self.idle], key=_BY_DISPATCHES)

    # -- the unit preference ------------------------------------------------------------
    def preferred_units(self, request: Request) -> set[int] | None:
        """The idle units `unit_preference` wants `request` on; None when it has no opinion."""
        if self.unit_preference is None or not self.idle:
            return None
        wanted = self.unit_preference(request, self.idle_order())
        if wanted is None:
            return None
        return {i for i in wanted if i in self.idle} or None

    def _accepts(self, request: Request, unit: Unit) -> bool:
        if self.unit_preference is None:
            return True
        wanted = self.preferred_units(request)
        return wanted is None or unit.id in wanted

    def _pick(self, request: Request, wanted: set[int], unit: Unit) -> Unit:
        """Among the preferred units: a hit first (locality), then `unit`, then the least dispatched."""
        return min(
            (self.units[i] for i in wanted),
            key=lambda u: (request.model not in u.cache, u is not unit, u.dispatches, u.id),
        )

    def _target(self, request: Request, unit: Unit) -> Unit:
        """Where a request the policy would run on idle `unit` runs, the preference heard."""
        wanted = self.preferred_units(request)
        return unit if wanted is None or unit.id in wanted else self._pick(request, wanted, unit)

    # -- shared mechanics ----------------------------------------------------------------
    def _enqueued(self, request: Request) -> None:
        pass

    def _dequeued(self, request: Request) -> None:
        pass

    def _withdrawn(self, request: Request) -> None:
        """A request left the global queue from anywhere in it (`withdraw`), not in order."""

    def _take(self, request: Request) -> None:
        del self.queue[request.seq]
        self._dequeued(request)

    def _dispatch(self, request: Request, unit: Unit, now: float) -> Dispatch:
        model = self.models[request.model]
        cache, holders, uid = unit.cache, self.holders, unit.id
        hit = request.model in cache
        false_miss = (not hit) and bool(holders.get(request.model))
        if model.name in cache:  # the model becomes the unit's most recently used, nothing evicted
            cache.touch(model.name)
            evicted: tuple[str, ...] = ()
        else:
            try:
                evicted = tuple(cache.load(model.name, model.size_mb))
            except ModelTooLarge as exc:
                raise PlacementError(f"unit {uid}: {exc}") from None
            for name in evicted:
                holders[name].discard(uid)
        duration = model.infer_s + (0.0 if hit else model.load_s)
        holders.setdefault(model.name, set()).add(uid)
        unit.running = request
        unit.busy_until = now + duration
        unit.dispatches += 1
        self.idle.discard(uid)
        return Dispatch(request, uid, hit, false_miss, evicted, now, duration)


class LBScheduler(_Base):
    """Baseline load balancing: an idle unit takes the head of the global queue, hit or miss."""

    name = "lb"

    def schedule(self, now: float) -> list[Dispatch]:
        out: list[Dispatch] = []
        if not self.queue or not self.idle:  # nothing to place, or nowhere to place it
            return out
        for unit in self.idle_order():
            if not self.queue:
                break
            while self.queue and unit.idle:  # a request the preference sends elsewhere leaves `unit` idle
                head = next(iter(self.queue.values()))
                target = self._target(head, unit)
                self._take(head)
                out.append(self._dispatch(head, target, now))
        return out


class LALBScheduler(_Base):
    """Locality-aware load balancing with out-of-order dispatch (Algorithms 1 and 2)."""

    lookahead_loads = 1.0

    def __init__(self, units: list[Unit], models: dict[str, Model], o3_limit: int = 25):
        super().__init__(units, models)
        if o3_limit < 0:
            raise PlacementError(f"o3_limit: must be >= 0, got {o3_limit}")
        self.o3_limit = o3_limit
        self.name = "lalb_o3" if o3_limit > 0 else "lalb"
        self.by_model: dict[str, deque[Request]] = {}  # queued requests linked per model
        self._skips: list[int] = []  # heap of skip-event boundaries (sequence numbers)

    def _enqueued(self, request: Request) -> None:
        q = self.by_model.get(request.model)
        if q is None:
            self.by_model[request.model] = deque((request,))
        else:
            q.append(request)

    def _dequeued(self, request: Request) -> None:
        # every removal from the global queue is the oldest request of its model
        q = self.by_model[request.model]
        assert q[0] is request, "requests leave their model's list in arrival order"
        q.popleft()
        if not q:
            del self.by_model[request.model]

    def _withdrawn(self, request: Request) -> None:
        q = self.by_model[request.model]
        q.remove(request)
        if not q:
            del self.by_model[request.model]

    def visits(self, request: Request) -> int:
        """Times a queued `request` has been skipped (for inspection; the hot path uses the head)."""
        return sum(1 for b in self._skips if b > request.seq)

    def _head_visits(self, head: Request) -> int:
        # boundaries at or below the head count for no queued request, now or later: drop them
        while self._skips and self._skips[0] <= head.seq:
            heapq.heappop(self._skips)
        return len(self._skips)

    def _finish_estimate(self, unit: Unit, now: float) -> float:
        return max(0.0, unit.busy_until - now) + unit.queued_work_s

    # -- Algorithm 1 ---------------------------------------------------------------------
    def schedule(self, now: float) -> list[Dispatch]:
        out: list[Dispatch] = []
        if not self.idle:
            return out
        queue, units = self.queue, self.units
        if not queue and not any(units[i].local_queue for i in self.idle):  # nothing to place
            return out
        for unit in self.idle_order():
            if unit.running is not None:  # taken meanwhile by Algorithm 2, line 5
                continue
            if unit.local_queue:  # lines 2-4: the local queue first
                request = unit.local_queue.popleft()
                unit.queued_work_s -= self.models[request.model].infer_s
                out.append(self._dispatch(request, unit, now))
                continue
            if queue:
                self._serve(unit, now, out)
        return out

    def _candidate(self, unit: Unit) -> Request | None:
        """The oldest queued request whose model `unit` holds (cost: the unit's cached models),
        among the models whose oldest request the unit preference accepts on `unit`."""
        best = None
        by_model = self.by_model
        anywhere = self.unit_preference is None
        for model in unit.cache:
            q = by_model.get(model)
            if q and (best is None or q[0].seq < best.seq) and (anywhere or self._accepts(q[0], unit)):
                best = q[0]
        return best

    def _serve(self, unit: Unit, now: float, out: list[Dispatch]) -> None:
        queue = self.queue
        while queue:
            head = next(iter(queue.values()))
            cand = self._candidate(unit)
            if cand is head:  # lines 7-8: a hit, in order
                self._take(head)
                out.append(self._dispatch(head, unit, now))
                return
            if self._head_visits(head) >= self.o3_limit:  # lines 11-13: skipped enough, place it now
                if self._locality_load_balance(unit, head, now, out):
                    return
                continue  # head went elsewhere; look again
            if cand is not None:  # lines 6-8, 15: dispatch out of order, skipping those ahead
                heapq.heappush(self._skips, cand.seq)
                self._take(cand)
                out.append(self._dispatch(cand, unit, now))
                return
            # lines 17-21: nothing cached here; every queued request was visited once
            heapq.heappush(self._skips, self._next_seq)
            while self.queue:
                head = next(iter(self.queue.values()))
                if self._locality_load_balance(unit, head, now, out):
                    return
            return

    # -- Algorithm 2 ---------------------------------------------------------------------
    def _locality_load_balance(self, unit: Unit, request: Request, now: float, out: list[Dispatch]) -> bool:
        """Place `request`; True when it went to `unit` (which is then busy)."""
        wanted = None if self.unit_preference is None else self.preferred_units(request)
        if wanted is not None:  # the preference chose the units; locality picks among them
            target = self._pick(request, wanted, unit)
            self._take(request)
            out.append(self._dispatch(request, target, now))
            return target is unit
        holders = self.holders.get(request.model)
        if not holders:  # lines 1-3: cached nowhere, a (true) miss here
            self._take(request)
            out.append(self._dispatch(request, unit, now))
            return True
        units, idle = self.units, self.idle
        idle_holders = [units[i] for i in holders if i in idle]
        if idle_holders:  # lines 4-6: a hit on another idle unit
            other = min(idle_holders, key=_BY_DISPATCHES)
            self._take(request)
            out.append(self._dispatch(request, other, now))
            # `unit` itself may be that holder: with a unit preference, `_candidate` can pass over a
            # request that the preference, asked again once its units are taken, leaves to locality
            return other is unit
        model = self.models[request.model]
        # the holder that frees up first (then the lowest id), each estimate computed once
        best, soonest = min(((units[i], self._finish_estimate(units[i], now)) for i in holders), key=_BY_ESTIMATE)
        if soonest < model.load_s:  # lines 8-14: wait for a busy holder
            self._take(request)
            best.local_queue.append(request)
            best.queued_work_s += model.infer_s
            return False
        self._take(request)  # lines 16-18: a miss here beats waiting
        out.append(self._dispatch(request, unit, now))
        return True


class LookAhead:
    """How much queued work a driver that keeps its own queue (the scheduler's class queue) hands
    the placement policy: while fewer jobs wait in it than there are units, or while their work is
    under the policy's look-ahead (`lookahead_loads` model load times per unit: LALB spreads a busy
    model only once its holders' backlog reaches a load time; LB needs none). The scheduler daemon's
    admission and the simulator's (`faas_gpu.sim.engine`, `admission=True`) both ask it, so both
    show the policy the same window of the queue."""

    def __init__(self, policy: _Base, units: int, longest_load_s: float):
        self.units = max(1, units)
        self.horizon_s = self.units * longest_load_s * policy.lookahead_loads
        self.jobs, self.work_s = policy.queued(), policy.queued_work_s()

    def room(self) -> bool:
        return self.jobs < self.units or self.work_s < self.horizon_s

    def took(self, infer_s: float) -> None:
        """One more job handed to the policy, `infer_s` of work."""
        self.jobs += 1
        self.work_s += infer_s


def make_scheduler(name: str, units: list[Unit], models: dict[str, Model], o3_limit: int = 25):
    """`lb`, `lalb` (no out-of-order dispatch) or `lalb_o3` (skip limit `o3_limit`)."""
    if name == "lb":
        return LBScheduler(units, models)
    if name == "lalb":
        return LALBScheduler(units, models, o3_limit=0)
    if name == "lalb_o3":
        return LALBScheduler(units, models, o3_limit=o3_limit)
    raise PlacementError(f"policy: unknown policy {name!r} (lb, lalb, lalb_o3)")
