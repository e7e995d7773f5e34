"""The discrete-event simulator: the real placement policy objects on a virtual clock.

A heap of events (an arrival, or a job's completion) drives it, as the daemon's loop goes: wait
for an arrival or a completion, then ask the policy. Ties in time go in the order the events were
scheduled, and the jobs an event dispatches start after that event, in dispatch order, so a seed
fixes the whole run. It ran on simpy processes until issue 18; the loop keeps simpy's order to the
last event (the results are identical) at about half the cost per request, which is what a day of
a busy trace needs (`benchmarks/sim_speed.py`). The PROTEAN simulation (`sim/protean/`), with its
many interacting processes, stays on simpy.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush

import numpy as np

from faas_gpu.policies import Dispatch, LookAhead, ModelCache, Request, Unit, make_scheduler
from faas_gpu.policies.protean.classes import admission_queue, admit

from .scenario import Scenario
from .trace import Workload, build_workload


@dataclass
class RunResult:
    policy: str
    o3_limit: int
    working_set: int
    latencies: np.ndarray
    hits: int
    misses: int
    false_misses: int
    infer_busy_s: float
    makespan_s: float
    units: int
    top_model_duplicates: float
    completed_ids: list[int] = field(repr=False)
    unit_intervals: dict[int, list[tuple[float, float]]] = field(repr=False)
    peak_memory_ratio: float = 0.0
    # for the report's timeline (`faas-gpu sim` writes it): when each job started and whether it
    # hit, and the cluster's loaded model memory (MB) after each change, as (time, MB) steps
    dispatch_times: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    dispatch_hits: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)
    dispatch_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int), repr=False)  # request ids
    memory_steps: list[tuple[float, float]] = field(default_factory=list, repr=False)
    memory_capacity_mb: float = 0.0

    def summary(self) -> dict[str, float | int | str]:
        n = len(self.latencies)
        dispatched = self.hits + self.misses
        return {
            "policy": self.policy,
            "o3_limit": self.o3_limit,
            "working_set": self.working_set,
            "requests": n,
            "avg_latency_s": float(self.latencies.mean()) if n else 0.0,
            "p50_latency_s": float(np.percentile(self.latencies, 50)) if n else 0.0,
            "p99_latency_s": float(np.percentile(self.latencies, 99)) if n else 0.0,
            "miss_ratio": self.misses / dispatched if dispatched else 0.0,
            "false_miss_ratio": self.false_misses / self.misses if self.misses else 0.0,
            "avg_top_model_duplicates": self.top_model_duplicates,
            "sm_utilization": self.infer_busy_s / (self.units * self.makespan_s) if self.makespan_s else 0.0,
            "makespan_s": self.makespan_s,
        }


def simulate(
    scenario: Scenario,
    policy: str | None = None,
    o3_limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    workload: Workload | None = None,
    *,
    admission: bool = False,
    warm: dict[int, list[str]] | None = None,
    service_s: Sequence[float | None] | None = None,
    load_s: Sequence[float | None] | None = None,
) -> RunResult:
    """Run one policy over the scenario's trace; `progress(n)` is called per completed request.

    `workload` is the scenario's `build_workload` result when the caller already has it (the CLI
    builds it once to print its notes and count the requests, then runs every policy on it).

    `admission`: requests wait in the scheduler daemon's class queue (`admission_queue`, every
    request strict, in arrival order) and the policy is handed only its look-ahead of them
    (`LookAhead`), as the live scheduler feeds it; off (the default), every arrival goes to the
    policy at once, as the GPU-FaaS paper's global queue is the policy's own. `faas-gpu replay`
    compares with the live stack, so it turns it on. `warm`: models already cached per unit id
    at the start, least recently used first (the live stack's caches when its replay began).
    `service_s`: per request (by its index in the arrivals), the time its job takes its unit when
    the model is loaded (None: the model's `infer_s`); a miss adds the model's `load_s`, or the
    request's own in `load_s` (None: the model's). The policy still plans with the models'
    figures, as the live scheduler plans with its estimates.

    The cyclic garbage collector is paused for the run: every request, decision and record it
    makes lives until the result is built, and the loop makes no reference cycles, so the
    collector's passes over a growing heap (~12% of the time at 500 k requests) find nothing.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _simulate(scenario, policy, o3_limit, progress, workload, admission, warm or {}, service_s, load_s)
    finally:
        if paused:
            gc.enable()


def _simulate(
    scenario: Scenario,
    policy: str | None,
    o3_limit: int | None,
    progress: Callable[[int], None] | None,
    workload: Workload | None,
    admission: bool,
    warm: dict[int, list[str]],
    service_s: Sequence[float | None] | None,
    load_s: Sequence[float | None] | None,
) -> RunResult:
    policy = policy or scenario.policy
    o3 = scenario.o3_limit if o3_limit is None else o3_limit
    workload = workload or build_workload(scenario.trace, scenario.models, scenario.seed)
    arrivals, models = workload.arrivals, workload.models
    catalog = {m.name: m for m in models}
    cl = scenario.cluster
    units = [
        Unit(id=n * cl.units_per_node + i, node=n, cache=ModelCache(cl.unit_memory_mb))
        for n in range(cl.nodes)
        for i in range(cl.units_per_node)
    ]
    sched = make_scheduler(policy, units, catalog, o3)
    for uid, names in warm.items():  # the caches as the run finds them
        unit = sched.units[uid]
        for name in names:
            for gone in unit.cache.load(name, catalog[name].size_mb):
                sched.holders[gone].discard(uid)
            sched.holders.setdefault(name, set()).add(uid)
    popularity: dict[str, int] = {}
    for a in arrivals:
        popularity[a.model] = popularity.get(a.model, 0) + 1
    top_model = max(popularity, key=lambda m: (popularity[m], m)) if popularity else ""

    lat: list[float] = []
    completed: list[int] = []
    intervals: dict[int, list[tuple[float, float]]] = {u.id: [] for u in units}
    starts: list[float] = []
    hit_flags: list[bool] = []
    memory: list[tuple[float, float]] = []
    # the loop runs once per event: what it reads often is bound to local names here
    caches = {u.id: u.cache for u in units}
    capacity = {u.id: u.cache.capacity_mb for u in units}
    loaded = {u.id: u.cache.used_mb for u in units}
    infer_s = {m.name: m.infer_s for m in models}
    holders = sched.holders
    submit, schedule, complete = sched.submit, sched.schedule, sched.complete
    if admission:  # the live scheduler's class queue in front of the policy, and its look-ahead
        queue = admission_queue()
        longest_load_s = max(m.load_s for m in models)
        direct = submit

        def submit(request: Request, now: float) -> None:
            queue.push(request, now, request.arrival)  # strict, no SLO: earliest arrival first
            admit_waiting(now)

        def admit_waiting(now: float) -> None:
            window = LookAhead(sched, len(units), longest_load_s)
            for entry in admit(queue, now, window.room):
                direct(entry.item, now)
                window.took(infer_s[entry.item.model])

        def complete(unit: int, now: float, _done=sched.complete) -> Request:
            request = _done(unit, now)
            admit_waiting(now)
            return request

    hits = misses = false_misses = 0
    infer_busy = peak = dup_area = dup_t = 0.0
    memory_mb = sum(loaded.values())
    memory.append((0.0, memory_mb))
    ids: list[int] = []
    # the event list: (time, sequence number, a running job's dispatch, or None for the next
    # arrival); ties in time go in the order the events were scheduled
    events: list[tuple[float, int, Dispatch | None]] = []
    seq = 0
    n_arrivals = len(arrivals)
    i = 0  # the next arrival
    now = 0.0
    started: list[Dispatch] = []  # dispatched by the current event, started once it is handled
    job: Dispatch | None = None
    waited = False  # whether an event was scheduled for arrival i (not so at the start)
    while True:
        if job is None:  # arrivals: the one this event waited for, then every other one due now
            if waited:
                a = arrivals[i]
                submit(Request(i, a.model, a.time), now)
                dup_area += len(holders.get(top_model, ())) * (now - dup_t)
                dup_t = now
                started += schedule(now)
                i += 1
            while i < n_arrivals:
                a = arrivals[i]
                if a.time > now:
                    heappush(events, (now + (a.time - now), seq, None))
                    seq += 1
                    waited = True
                    break
                submit(Request(i, a.model, a.time), now)
                dup_area += len(holders.get(top_model, ())) * (now - dup_t)
                dup_t = now
                started += schedule(now)
                i += 1
        else:  # a job completes: its unit is free, the policy places what it can
            infer_busy += infer_s[job.request.model]
            intervals[job.unit].append((job.start, now))
            done = complete(job.unit, now)
            lat.append(now - done.arrival)
            completed.append(done.id)
            if progress:
                progress(1)
            dup_area += len(holders.get(top_model, ())) * (now - dup_t)
            dup_t = now
            started += schedule(now)
        for d in started:  # each job starts after the event that placed it, in dispatch order
            if d.hit:
                hits += 1
            else:
                misses += 1
            false_misses += d.false_miss
            u = d.unit
            used = caches[u].used_mb
            ratio = used / capacity[u]
            if ratio > peak:
                peak = ratio
            starts.append(d.start)
            hit_flags.append(d.hit)
            ids.append(d.request.id)
            if used != loaded[u]:  # a miss loaded (and maybe evicted) models
                memory_mb = memory_mb + used - loaded[u]
                memory.append((d.start, memory_mb))
                loaded[u] = used
            duration = d.duration
            if service_s is not None:  # measured per request (`faas-gpu replay`)
                rid = d.request.id
                model = catalog[d.request.model]
                run_s = service_s[rid] if service_s[rid] is not None else model.infer_s
                own_load = load_s[rid] if load_s is not None else None
                duration = run_s + (0.0 if d.hit else own_load if own_load is not None else model.load_s)
            heappush(events, (now + duration, seq, d))
            seq += 1
        started.clear()
        if not events:
            break
        now, _, job = heappop(events)
    dup_area += len(holders.get(top_model, ())) * (now - dup_t)
    makespan = now
    return RunResult(
        policy=sched.name,
        o3_limit=o3 if policy == "lalb_o3" else 0,
        working_set=len(models),
        latencies=np.array(lat),
        hits=hits,
        misses=misses,
        false_misses=false_misses,
        infer_busy_s=infer_busy,
        makespan_s=makespan,
        units=len(units),
        top_model_duplicates=dup_area / makespan if makespan else 0.0,
        completed_ids=completed,
        unit_intervals=intervals,
        peak_memory_ratio=peak,
        dispatch_times=np.array(starts),
        dispatch_hits=np.array(hit_flags, dtype=bool),
        dispatch_ids=np.array(ids, dtype=int),
        memory_steps=memory,
        memory_capacity_mb=cl.unit_memory_mb * len(units),
    )
