"""The discrete-event simulator: the real placement policy objects on a virtual clock.

simpy drives it: it is the well-kept discrete-event library of the Python world, its processes
read like the daemon's loop (wait for an arrival or a completion, then ask the policy), and its
event queue breaks ties in scheduling order, so a seed fixes the whole run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from faas_gpu.policies import Dispatch, ModelCache, Request, Unit, make_scheduler

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
) -> RunResult:
    """Run one policy over the scenario's trace; `progress(n)` is called per completed request.

    `workload` is the scenario's `build_workload` result when the caller already has it (the CLI
    builds it once to print its notes and count the requests, then runs every policy on it).
    """
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
    env = simpy.Environment()
    popularity: dict[str, int] = {}
    for a in arrivals:
        popularity[a.model] = popularity.get(a.model, 0) + 1
    top_model = max(popularity, key=lambda m: (popularity[m], m))

    lat: list[float] = []
    completed: list[int] = []
    intervals: dict[int, list[tuple[float, float]]] = {u.id: [] for u in units}
    stats = {"hits": 0, "misses": 0, "false": 0, "infer": 0.0, "peak": 0.0, "dup_area": 0.0, "dup_t": 0.0}
    starts: list[float] = []
    hit_flags: list[bool] = []
    loaded = {u.id: 0.0 for u in units}
    memory: list[tuple[float, float]] = [(0.0, 0.0)]

    def account_duplicates() -> None:
        stats["dup_area"] += len(sched.holders.get(top_model, ())) * (env.now - stats["dup_t"])
        stats["dup_t"] = env.now

    def run_job(d: Dispatch):
        stats["hits" if d.hit else "misses"] += 1
        stats["false"] += d.false_miss
        unit = sched.units[d.unit]
        stats["peak"] = max(stats["peak"], unit.cache.used_mb / unit.cache.capacity_mb)
        starts.append(d.start)
        hit_flags.append(d.hit)
        if unit.cache.used_mb != loaded[d.unit]:  # a miss loaded (and maybe evicted) models
            memory.append((d.start, memory[-1][1] + unit.cache.used_mb - loaded[d.unit]))
            loaded[d.unit] = unit.cache.used_mb
        yield env.timeout(d.duration)
        stats["infer"] += catalog[d.request.model].infer_s
        intervals[d.unit].append((d.start, env.now))
        done = sched.complete(d.unit, env.now)
        lat.append(env.now - done.arrival)
        completed.append(done.id)
        if progress:
            progress(1)
        kick()

    def kick() -> None:
        account_duplicates()
        for d in sched.schedule(env.now):
            env.process(run_job(d))

    def arrive():
        for i, a in enumerate(arrivals):
            if a.time > env.now:
                yield env.timeout(a.time - env.now)
            sched.submit(Request(i, a.model, a.time), env.now)
            kick()

    env.process(arrive())
    env.run()
    account_duplicates()
    makespan = env.now
    return RunResult(
        policy=sched.name,
        o3_limit=o3 if policy == "lalb_o3" else 0,
        working_set=len(models),
        latencies=np.array(lat),
        hits=stats["hits"],
        misses=stats["misses"],
        false_misses=int(stats["false"]),
        infer_busy_s=stats["infer"],
        makespan_s=makespan,
        units=len(units),
        top_model_duplicates=stats["dup_area"] / makespan if makespan else 0.0,
        completed_ids=completed,
        unit_intervals=intervals,
        peak_memory_ratio=stats["peak"],
        dispatch_times=np.array(starts),
        dispatch_hits=np.array(hit_flags, dtype=bool),
        memory_steps=memory,
        memory_capacity_mb=cl.unit_memory_mb * len(units),
    )
