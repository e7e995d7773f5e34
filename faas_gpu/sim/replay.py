"""One trace on both sides (issue 45): what the live stack did, what the simulator predicts on the
service times measured in the same run, and how far apart they are.

`faas-gpu replay` (`faas_gpu/cli/replay.py`) sends the trace's requests to a live stack and
collects an `Outcome` per request; this module holds what does not touch the stack, so that it is
tested on its own:

- `figures`: a run's figures (mean and P99 latency, SLO misses, cold starts, cache hit ratio);
- `measured_profiles`, `serving_path_s`, `unit_hop_s`: the service times the live units measured
  (each answer carries its job's `X-Faas-Gpu-*` timings), per function;
- `simulate_side`: the simulator (`engine.simulate`, the policies' own objects, the live
  scheduler's admission in front of them) on the same arrivals, cluster shape, caches at the
  start, and those measured times;
- `compare`, `policy_order`, `same_order`: the ratios sim / live and whether both sides rank the
  policies alike; `table` prints them side by side.

What the simulator is told and what it is not (the comparison is only worth what this says):

- It is given each function's model size (what the unit is charged), load time and execute time
  as the live units measured them in the run being compared, plus the unit's own overhead per job
  (`unit_hop_s`: the scheduler's hop to the GPU Manager and back, measured on unqueued calls):
  each request's job runs for the time it ran live (`measured_service_s`), and a miss loads for
  as long as that request's load took live, or the loads measured nearest in time
  (`measured_load_s`); the policy plans with the medians (`measured_profiles`), as the live
  scheduler plans with its estimates. It predicts which job waits, where it runs, and which misses.
- The serving path outside the scheduler (gateway, watchdog, handler, GPU client: `serving_path_s`,
  the mean of each answer's latency less the scheduler's time) is not simulated; it is added to
  every simulated latency, so both sides are end to end (its variance is not: a P99 compares less
  well than a mean).
- Not modelled: the host's CPUs shared by the emulated units and the daemons (on the cpu back end
  a busy unit slows the others; the measured medians carry the run's average contention, not its
  peaks), the path's variance, and failures (a request the live stack did not answer is an error
  there and an SLO miss; the simulator answers every one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from faas_gpu.policies import Model
from faas_gpu.policies.infless import keepalive_policy

from .engine import simulate
from .infless.keepalive_replay import replay_keepalive
from .scenario import Cluster, Scenario, TraceSpec
from .trace import Arrival, Workload

FIGURES = ("mean_latency", "p99_latency", "slo_misses", "cold_starts", "hit_ratio", "miss_ratio")
"""The figures compared, as named in the JSON keys `sim_over_live_<policy>_<figure>`."""
GOAL = ("mean_latency", "miss_ratio")
"""The figures the issue's goal bounds: sim within ±20% of live."""
GOAL_TOLERANCE = 0.20
ORDER_TOLERANCE = 0.05
"""Two policies whose figures differ by less than this (relative) are tied on that side: a tie
agrees with either order on the other side."""


@dataclass
class Outcome:
    """One request, as one side saw it; times in seconds."""

    function: str
    sent_s: float  # when it was due (compressed trace time from the replay's start)
    latency_s: float | None  # from `sent_s` to the answer; None: not answered 200
    status: int | str = 200
    cache: str | None = None  # "hit" or "miss" (X-Faas-Gpu-Cache)
    unit: str | None = None
    scheduler_s: float | None = None  # from the job's arrival at the scheduler to its answer
    load_s: float | None = None  # the GPU Manager's load of the model (a miss)
    exec_s: float | None = None  # the GPU Manager's execution of the job
    model_mb: float | None = None  # what the model is charged on its unit
    process: str | None = None  # the replica process that answered (keep-alive runs)
    cold: bool | None = None  # that process started after the request was sent: it waited for a cold start

    @property
    def answered(self) -> bool:
        return self.latency_s is not None


@dataclass(frozen=True)
class Figures:
    requests: int
    answered: int
    errors: int
    mean_latency: float  # s, over the answered requests
    p99_latency: float
    slo_misses: int  # answered later than the function's SLO, or not answered
    cold_starts: int  # jobs that loaded their model (cache misses)
    hits: int

    @property
    def hit_ratio(self) -> float:
        jobs = self.hits + self.cold_starts
        return self.hits / jobs if jobs else 0.0

    @property
    def miss_ratio(self) -> float:
        jobs = self.hits + self.cold_starts
        return self.cold_starts / jobs if jobs else 0.0

    def value(self, figure: str) -> float:
        return float(getattr(self, figure))

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "hit_ratio": self.hit_ratio, "miss_ratio": self.miss_ratio}


def figures(outcomes: Sequence[Outcome], slo_s: Mapping[str, float], among: Sequence[Outcome] | None = None) -> Figures:
    """A run's figures; `slo_s` per function (a function without one has no SLO miss). `among`:
    the other side's outcomes of the same requests; the latencies are then taken over the requests
    both sides answered (the simulator answers every one; the live side may time out)."""
    both = [o for i, o in enumerate(outcomes) if among is None or among[i].answered]
    latencies = np.array([o.latency_s for o in both if o.latency_s is not None])
    answered = sum(1 for o in outcomes if o.answered)
    misses = sum(
        1 for o in outcomes if o.latency_s is None or (o.function in slo_s and o.latency_s > slo_s[o.function])
    )
    return Figures(
        requests=len(outcomes),
        answered=answered,
        errors=len(outcomes) - answered,
        mean_latency=float(latencies.mean()) if len(latencies) else 0.0,
        p99_latency=float(np.percentile(latencies, 99)) if len(latencies) else 0.0,
        slo_misses=misses,
        cold_starts=sum(1 for o in outcomes if o.cache == "miss"),
        hits=sum(1 for o in outcomes if o.cache == "hit"),
    )


# -- the service times measured live -----------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """A function's model as the live units measured it: what a unit is charged, its load time,
    and its execute time per job (one request, one job)."""

    size_mb: float
    load_s: float
    exec_s: float


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(known)) if known else None


def serving_path_s(outcomes: Iterable[Outcome]) -> float:
    """The serving path outside the scheduler (gateway, watchdog, handler, GPU client, both ways):
    the mean over answered requests of their latency less the scheduler's time. The mean, not
    the median: it is added to every simulated latency, so that the mean latencies compare (the
    path's tail is the live side's alone, and shows in its P99)."""
    path = [o.latency_s - o.scheduler_s for o in outcomes if o.latency_s is not None and o.scheduler_s is not None]
    return max(0.0, float(np.mean(path))) if path else 0.0


UNQUEUED_QUANTILE = 25.0
"""Of a run's answers, the share taken as unqueued when the unit's overhead is read from them."""
MIN_ANSWERS = 20


def unit_hop_s(calibration: Iterable[Outcome], run: Iterable[Outcome] = ()) -> float:
    """What a job costs its unit beyond the model's load and execution: the scheduler's hop to the
    GPU Manager and back. Read from the run's answers where there are enough (their lower
    quartile: the scheduler's time of a job that waited holds its wait too), else from the
    calibration's calls, sent one at a time (their median)."""

    def beyond(outcomes: Iterable[Outcome]) -> list[float]:
        return [
            o.scheduler_s - (o.load_s or 0.0) - o.exec_s
            for o in outcomes
            if o.scheduler_s is not None and o.exec_s is not None
        ]

    seen = beyond(run)
    if len(seen) >= MIN_ANSWERS:
        return max(0.0, float(np.percentile(seen, UNQUEUED_QUANTILE)))
    return max(0.0, _median(beyond(calibration)) or 0.0)


def measured_service_s(outcomes: Sequence[Outcome], hop_s: float = 0.0) -> list[float | None]:
    """Per request, what its job took its unit live once the model was loaded: its execute time plus
    the unit's overhead per job (None where the live side has no answer for it)."""
    return [None if o.exec_s is None else o.exec_s + hop_s for o in outcomes]


def measured_load_s(outcomes: Sequence[Outcome], nearest: int = 3) -> list[float | None]:
    """Per request, what a miss of its job costs: its own load where it missed live, else the median
    of the `nearest` live loads in time (of any function). On the cpu back end a load's time is
    mostly the node's: a worker process from a pool refilled one at a time, and CPUs shared with
    the other units, so the loads measured about then say more than a function's median."""
    misses = sorted((o.sent_s, o.load_s) for o in outcomes if o.cache == "miss" and o.load_s is not None)
    times = np.array([t for t, _ in misses])
    out: list[float | None] = []
    for o in outcomes:
        if o.cache == "miss" and o.load_s is not None:
            out.append(o.load_s)
        elif not misses:
            out.append(None)
        else:
            i = int(np.searchsorted(times, o.sent_s))
            lo, hi = max(0, i - nearest), min(len(misses), i + nearest)
            window = sorted(range(lo, hi), key=lambda j: abs(times[j] - o.sent_s))[:nearest]
            out.append(float(np.median([misses[j][1] for j in window])))
    return out


def measured_profiles(
    outcomes: Iterable[Outcome], fallback: Mapping[str, Profile], hop_s: float = 0.0
) -> dict[str, Profile]:
    """Per function, the medians its answers carried (load time over its misses, execute time over
    all its jobs, plus `hop_s`; the size charged, the largest); `fallback` where a run measured
    nothing (a function with no miss in the run keeps the load time measured before it)."""
    by_function: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.answered:
            by_function.setdefault(o.function, []).append(o)
    out = {}
    for name, base in fallback.items():
        seen = by_function.get(name, [])
        load = _median(o.load_s for o in seen if o.cache == "miss")
        execute = _median(o.exec_s for o in seen)
        sizes = [o.model_mb for o in seen if o.model_mb]
        out[name] = Profile(
            max(sizes) if sizes else base.size_mb,
            base.load_s if load is None else load,
            base.exec_s if execute is None else execute + hop_s,
        )
    return out


# -- the simulator on the same arrivals ---------------------------------------------------------
@dataclass
class SimSide:
    outcomes: list[Outcome]
    profiles: dict[str, Profile]
    path_s: float
    notes: list[str] = field(default_factory=list)


def simulate_side(
    arrivals: Sequence[tuple[float, str]],
    profiles: Mapping[str, Profile],
    cluster: Cluster,
    policy: str,
    o3_limit: int,
    path_s: float,
    warm: Mapping[int, list[str]] | None = None,
    service_s: Sequence[float | None] | None = None,
    load_s: Sequence[float | None] | None = None,
) -> SimSide:
    """The simulator on `arrivals` ((time s, function), sorted by time), with the live scheduler's
    admission in front of the policy; each latency is the simulated one plus `path_s`.
    `service_s`: per arrival, its job's time on its unit as measured live (None: the profile's);
    `load_s`: per arrival, the load a miss of its job takes (None: the profile's)."""
    models = [Model(name, p.size_mb, p.load_s, p.exec_s) for name, p in profiles.items()]
    workload = Workload(
        arrivals=[Arrival(t, f) for t, f in arrivals],
        models=models,
        functions=list(profiles),
        recorded=np.zeros((len(models), 1)),
        counts=np.zeros((len(models), 1), dtype=int),
        scale=1.0,
    )
    spec = TraceSpec(files=[], format="per-minute", minutes=1, start_minute=0, working_set=len(models))
    scenario = Scenario("replay", 1, cluster, models, spec, policy, o3_limit)
    run = simulate(
        scenario,
        policy,
        o3_limit,
        workload=workload,
        admission=True,
        warm=dict(warm or {}),
        service_s=service_s,
        load_s=load_s,
    )
    latency = dict(zip(run.completed_ids, run.latencies, strict=True))
    cache = {int(i): ("hit" if h else "miss") for i, h in zip(run.dispatch_ids, run.dispatch_hits, strict=True)}
    outcomes = [Outcome(f, t, float(latency[i]) + path_s, cache=cache.get(i)) for i, (t, f) in enumerate(arrivals)]
    return SimSide(outcomes, dict(profiles), path_s)


# -- the comparison -----------------------------------------------------------------------------
def ratio(sim: float, live: float) -> float | None:
    """sim / live; 1 where both are 0 (they agree), None where only live is 0 (no ratio)."""
    if live == 0:
        return 1.0 if sim == 0 else None
    return sim / live


def compare(sim: Mapping[str, Figures], live: Mapping[str, Figures]) -> dict[str, float | None]:
    """`sim_over_live_<policy>_<figure>` for every policy both sides ran and every figure."""
    out: dict[str, float | None] = {}
    for name in live:
        if name in sim:
            for f in FIGURES:
                r = ratio(sim[name].value(f), live[name].value(f))
                out[f"sim_over_live_{name}_{f}"] = None if r is None else round(r, 4)
    return out


def _sign(a: float, b: float, tolerance: float) -> int:
    """-1 / 1 when a is clearly below / above b, 0 when they are within `tolerance` (a tie)."""
    if abs(a - b) <= tolerance * max(abs(a), abs(b)):
        return 0
    return -1 if a < b else 1


def policy_order(side: Mapping[str, Figures], figure: str) -> list[str]:
    """The policies, best (lowest) first by `figure` (for hit_ratio: highest first)."""
    sign = -1.0 if figure == "hit_ratio" else 1.0
    return sorted(side, key=lambda name: (sign * side[name].value(figure), name))


def same_order(
    sim: Mapping[str, Figures], live: Mapping[str, Figures], figure: str, tolerance: float = ORDER_TOLERANCE
) -> bool:
    """Both sides rank every pair of policies alike by `figure`: no pair is clearly one way round
    on one side and clearly the other way round on the other (a tie on either side agrees)."""
    names = [n for n in live if n in sim]
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            s = _sign(sim[a].value(figure), sim[b].value(figure), tolerance)
            v = _sign(live[a].value(figure), live[b].value(figure), tolerance)
            if s * v < 0:
                return False
    return True


def verdict(sim: Mapping[str, Figures], live: Mapping[str, Figures]) -> dict[str, object]:
    """The comparison's summary: the ratios, whether both sides order the policies alike (by mean
    latency and by miss ratio), and whether the goal's figures are within ±20%."""
    ratios = compare(sim, live)
    goal = [ratios.get(f"sim_over_live_{n}_{f}") for n in live if n in sim for f in GOAL]
    return {
        **ratios,
        "same_policy_order": all(same_order(sim, live, f) for f in ("mean_latency", "miss_ratio")),
        "policy_order_live": policy_order(live, "mean_latency"),
        "policy_order_sim": policy_order(sim, "mean_latency"),
        "within_20pct": bool(goal) and all(r is not None and abs(r - 1.0) <= GOAL_TOLERANCE for r in goal),
    }


def table(sim: Mapping[str, Figures], live: Mapping[str, Figures]) -> str:
    """Side by side, a block per policy: each figure live, simulated, and sim / live."""
    rows = [f"{'policy':<10} {'figure':<13} {'live':>10} {'sim':>10} {'sim/live':>9}"]
    units = {"mean_latency": "s", "p99_latency": "s"}
    for name in live:
        if name not in sim:
            continue
        lf, sf = live[name], sim[name]
        for f in FIGURES:
            r = ratio(sf.value(f), lf.value(f))
            fmt = "{:>10.3f}" if f in units or f.endswith("ratio") else "{:>10.0f}"
            rows.append(
                f"{name:<10} {f + (' (s)' if f in units else ''):<13} {fmt.format(lf.value(f))} "
                f"{fmt.format(sf.value(f))} {'-' if r is None else f'{r:.2f}':>9}"
            )
        rows.append(f"{name:<10} {'errors':<13} {lf.errors:>10} {sf.errors:>10}")
    return "\n".join(rows)


# -- INFless keep-alive: LSTH against HHP on the same trace -------------------------------------
KEEPALIVE_POLICIES = ("lsth", "hhp")
KEEPALIVE_FIGURES = ("cold_starts", "cold_rate", "idle_minutes")
"""What a keep-alive run is compared on, as the Fig. 16 replay counts it: cold starts (a minute that
found its function's instance gone; live, a replica process started for a request already
waiting), per invocation, and the minutes an instance was loaded with nothing to do."""


@dataclass(frozen=True)
class KeepAliveFigures:
    invocations: int
    answered: int
    cold_starts: int
    idle_minutes: float  # trace minutes

    @property
    def cold_rate(self) -> float:
        return self.cold_starts / self.invocations if self.invocations else 0.0

    def value(self, figure: str) -> float:
        return float(getattr(self, figure))

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "cold_rate": self.cold_rate}


def minute_counts(
    arrivals: Sequence[tuple[float, str]], functions: Sequence[str], compress: float, minutes: int
) -> dict[str, list[int]]:
    """Per function, its requests in each trace minute of the replay (times are compressed seconds)."""
    out = {f: [0] * minutes for f in functions}
    for t, f in arrivals:
        m = int(t * compress // 60)
        if f in out and 0 <= m < minutes:
            out[f][m] += 1
    return out


def simulate_keepalive(counts: Mapping[str, Sequence[int]], policy: str) -> KeepAliveFigures:
    """The Fig. 16 replay (`replay_keepalive`) of each function's minutes under `policy` (built by
    `keepalive_policy`, as the provider builds it from the annotation), summed over the functions."""
    stats = [replay_keepalive(c, keepalive_policy(policy)) for c in counts.values()]
    return KeepAliveFigures(
        invocations=sum(s.invocations for s in stats),
        answered=sum(s.invocations for s in stats),
        cold_starts=sum(s.cold_starts for s in stats),
        idle_minutes=sum(s.wasted_minutes for s in stats),
    )


@dataclass(frozen=True)
class ReplicaSample:
    """How many replicas of a function ran (starting ones included) at a moment of the replay
    (compressed seconds), as the gateway's `/system/functions` said."""

    t_s: float
    function: str
    ready: int


def live_keepalive(
    outcomes: Sequence[Outcome],
    samples: Sequence[ReplicaSample],
    counts: Mapping[str, Sequence[int]],
    compress: float,
    minutes: int,
) -> KeepAliveFigures:
    """The live side counted as the replay counts: a cold start per replica process that a request
    waited for (it started after the request was sent), and the trace minutes a function had a
    replica running in a minute without invocations (`samples`, read from the gateway while the
    trace played; each sample stands for the time to the next one of its function)."""
    cold = {(o.function, o.process) for o in outcomes if o.cold and o.process is not None}
    idle = 0.0
    by_function: dict[str, list[ReplicaSample]] = {}
    for sample in sorted(samples, key=lambda x: x.t_s):
        by_function.setdefault(sample.function, []).append(sample)
    for f, seen in by_function.items():
        active = counts.get(f)
        if active is None:
            continue
        for a, b in zip(seen, seen[1:], strict=False):
            m = int(a.t_s * compress // 60)
            if a.ready > 0 and 0 <= m < minutes and not active[m]:
                idle += (min(b.t_s, minutes * 60.0 / compress) - a.t_s) * compress / 60.0
    return KeepAliveFigures(
        invocations=len(outcomes),
        answered=sum(1 for o in outcomes if o.answered),
        cold_starts=len(cold),
        idle_minutes=max(0.0, idle),
    )


def keepalive_verdict(sim: Mapping[str, KeepAliveFigures], live: Mapping[str, KeepAliveFigures]) -> dict[str, object]:
    """`sim_over_live_<lsth|hhp>_<figure>`, and whether both sides rank the keep-alive policies alike
    by cold starts (a tie within 5% agrees with either order)."""
    out: dict[str, object] = {}
    for name in live:
        if name in sim:
            for f in KEEPALIVE_FIGURES:
                r = ratio(sim[name].value(f), live[name].value(f))
                out[f"sim_over_live_{name}_{f}"] = None if r is None else round(r, 4)
    out["same_keepalive_order"] = same_order(sim, live, "cold_starts")
    return out


def keepalive_table(sim: Mapping[str, KeepAliveFigures], live: Mapping[str, KeepAliveFigures]) -> str:
    rows = [f"{'keep-alive':<10} {'figure':<13} {'live':>10} {'sim':>10} {'sim/live':>9}"]
    for name in live:
        if name not in sim:
            continue
        for f in KEEPALIVE_FIGURES:
            r = ratio(sim[name].value(f), live[name].value(f))
            fmt = "{:>10.0f}" if f == "cold_starts" else "{:>10.3f}" if f == "cold_rate" else "{:>10.1f}"
            rows.append(
                f"{name:<10} {f:<13} {fmt.format(live[name].value(f))} {fmt.format(sim[name].value(f))} "
                f"{'-' if r is None else f'{r:.2f}':>9}"
            )
    return "\n".join(rows)
