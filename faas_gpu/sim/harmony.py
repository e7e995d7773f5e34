"""Replaying app traces against HarmonyBatch plans: what a plan costs and how often it misses SLOs.

Each app's requests arrive as a Poisson process at its rate. A group's buffer opens with its first
request, whose app's timeout sets the deadline; every later request may bring the deadline
forward (its arrival + its app's timeout). The batch leaves when it is full or at the deadline,
and runs on its own function instance (serverless: no queueing between batches). Its run time is
drawn from the latency model: the average, or with `noise` a normal around the average with the
maximum at 2.33 standard deviations (the maximum is then the 99th percentile; the authors'
simulation does the same). A request misses its SLO when wait + run time exceeds it. Each batch
is billed with the price list (GPU calls in whole seconds where the prices say so).

`replay` re-plans every minute with that minute's rates, as the authors' experiments do, and
feeds every strategy the same arrivals (common random numbers), so costs compare like for like.
`replay_live` replays the same arrivals through the provider's live pools instead (`AppPools`
from `app_pools`, the object `provider.scaling.harmony` decides with): the rates measured over
its window at every tick of the provider's loop, a re-plan every plan period applied only when
it differs enough, the plan in force serving each request.
Everything is seeded: same inputs, same result.

It lives in `faas_gpu.sim`, beside the other simulators, and not in `faas_gpu.policies`: it reads
trace files and draws random numbers, and the policies it drives stay pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from faas_gpu.policies.harmony.cost import Prices
from faas_gpu.policies.harmony.models import ModelCoefficients
from faas_gpu.policies.harmony.plans import App, Group, Plan
from faas_gpu.policies.harmony.pools import app_pools

Z_MAX = 2.33  # the maximum latency sits this many standard deviations above the average


@dataclass
class SimResult:
    """Totals of a run; per-app counts of requests and SLO misses."""

    requests: int = 0
    violations: int = 0
    cost: float = 0.0
    batches: int = 0
    predicted_cost: float = 0.0  # what the plans predicted for the same requests
    per_app: dict[str, list[int]] = field(default_factory=dict)

    @property
    def violation_rate(self) -> float:
        return self.violations / self.requests if self.requests else 0.0

    @property
    def cost_per_request(self) -> float:
        return self.cost / self.requests if self.requests else 0.0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0

    def add(self, other: SimResult) -> None:
        self.requests += other.requests
        self.violations += other.violations
        self.cost += other.cost
        self.batches += other.batches
        self.predicted_cost += other.predicted_cost
        for name, (n, v) in other.per_app.items():
            row = self.per_app.setdefault(name, [0, 0])
            row[0] += n
            row[1] += v


@dataclass(frozen=True)
class TraceApp:
    """An app of a replay: SLO (s) and its rate (req/s) in each minute."""

    name: str
    slo: float
    rates: tuple[float, ...]


def load_app_trace(path: str | Path, scale: float = 1.0) -> tuple[float, ...]:
    """A per-minute request-count CSV (the reference's `app*.csv`) as rates: count / 60 req/s."""
    text = Path(path).read_text().replace("\n", ",")
    return tuple(float(x) * scale / 60.0 for x in text.split(",") if x.strip())


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted arrival times of a Poisson process on [0, duration)."""
    n = int(rng.poisson(rate * duration_s)) if rate > 0 else 0
    return np.sort(rng.uniform(0.0, duration_s, n))


def _latency_fn(group: Group, model: ModelCoefficients) -> Callable[[int], tuple[float, float]]:
    p = group.provision
    if p.kind == "cpu":
        return lambda k: (model.cpu.latency_avg(p.vcpu, k), model.cpu.latency_max(p.vcpu, k))
    return lambda k: (model.gpu.latency_avg(p.gpu_gb, k, p.vcpu), model.gpu.latency_max(p.gpu_gb, k, p.vcpu))


def simulate_group(
    group: Group,
    arrivals: Sequence[np.ndarray],
    model: ModelCoefficients,
    prices: Prices,
    rng: np.random.Generator,
    noise: bool = True,
) -> SimResult:
    """Batch one group's arrivals (one array per app of the group, in `group.apps` order) and run them.

    Latency comes from the true model (`model`, not a deterministic view of it) whatever the plan assumed.
    """
    p = group.provision
    res = SimResult()
    times = np.concatenate([np.asarray(a, dtype=float) for a in arrivals]) if arrivals else np.empty(0)
    if times.size == 0:
        return res
    owner = np.concatenate([np.full(len(a), i) for i, a in enumerate(arrivals)])
    order = np.argsort(times, kind="stable")
    times, owner = times[order].tolist(), owner[order].tolist()
    timeouts = list(p.timeouts) if p.batch > 1 else [0.0] * len(group.apps)
    slos = [a.slo for a in group.apps]
    latency = _latency_fn(group, model)
    cache: dict[int, tuple[float, float]] = {}
    z = rng.standard_normal(len(times)).tolist() if noise else None
    n_app = [0] * len(group.apps)
    v_app = [0] * len(group.apps)
    buf: list[tuple[float, int]] = []
    deadline = math.inf

    def dispatch(at: float) -> None:
        k = len(buf)
        if k not in cache:
            cache[k] = latency(k)
        avg, mx = cache[k]
        run = avg
        if z is not None and mx > avg:
            run = max(0.0, avg + z[res.batches] * (mx - avg) / Z_MAX)
        res.batches += 1
        res.cost += prices.invocation_cost(run, p.vcpu, p.memory_gb, p.gpu_gb)
        for t, i in buf:
            n_app[i] += 1
            if at - t + run > slos[i]:
                v_app[i] += 1
        buf.clear()

    for t, i in zip(times, owner, strict=True):
        if buf and t > deadline:
            dispatch(deadline)
        if not buf:
            deadline = t + timeouts[i]
        else:
            deadline = min(deadline, t + timeouts[i])
        buf.append((t, i))
        if len(buf) >= p.batch:
            dispatch(t)
    if buf:
        dispatch(deadline)
    res.requests = sum(n_app)
    res.violations = sum(v_app)
    res.predicted_cost = res.requests * p.cost_per_request
    for a, n, v in zip(group.apps, n_app, v_app, strict=True):
        row = res.per_app.setdefault(a.name, [0, 0])
        row[0] += n
        row[1] += v
    return res


def simulate_plan(
    plan: Plan,
    arrivals: dict[str, np.ndarray],
    model: ModelCoefficients,
    prices: Prices,
    rng: np.random.Generator,
    noise: bool = True,
) -> SimResult:
    """Run a plan on given arrivals per app. An app split over groups (MBS+) has its requests thinned
    over them in proportion to the groups' shares of its rate."""
    shares: dict[str, list[tuple[int, int, float]]] = {}
    for gi, g in enumerate(plan.groups):
        for ai, a in enumerate(g.apps):
            shares.setdefault(a.name, []).append((gi, ai, a.rate))
    per_group: list[list[np.ndarray]] = [[np.empty(0)] * len(g.apps) for g in plan.groups]
    for name, times in arrivals.items():
        where = shares.get(name)
        if not where:
            if len(times):
                raise ValueError(f"simulate_plan: requests for {name!r}, which the plan does not serve")
            continue
        if len(where) == 1:
            gi, ai, _ = where[0]
            per_group[gi][ai] = times
            continue
        w = np.array([r for _, _, r in where], dtype=float)
        pick = rng.choice(len(where), size=len(times), p=w / w.sum()) if w.sum() > 0 else np.zeros(len(times), int)
        for j, (gi, ai, _) in enumerate(where):
            per_group[gi][ai] = times[pick == j]
    total = SimResult()
    for g, arr in zip(plan.groups, per_group, strict=True):
        total.add(simulate_group(g, arr, model, prices, rng, noise))
    return total


def replay(
    apps: Sequence[TraceApp],
    planner: Callable[[list[App]], Plan],
    model: ModelCoefficients,
    prices: Prices,
    minutes: Sequence[int],
    window_s: float = 60.0,
    seed: int = 0,
    noise: bool = True,
) -> SimResult:
    """Re-plan every minute with that minute's rates and simulate `window_s` seconds of it.

    Arrivals depend only on (seed, minute, app), so every planner sees the same requests.
    """
    total = SimResult()
    for minute in minutes:
        current = [App(a.name, a.slo, a.rates[minute]) for a in apps if a.rates[minute] > 0]
        if not current:
            continue
        plan = planner(current)
        arrivals = {
            a.name: poisson_arrivals(a.rate, window_s, np.random.default_rng([seed, minute, i]))
            for i, a in enumerate(current)
        }
        rng = np.random.default_rng([seed, minute, 1_000_003])
        total.add(simulate_plan(plan, arrivals, model, prices, rng, noise))
    return total


def replay_live(
    apps: Sequence[TraceApp],
    planner: Callable[[list[App]], Plan],
    model: ModelCoefficients,
    prices: Prices,
    minutes: Sequence[int],
    window_s: float = 60.0,
    seed: int = 0,
    noise: bool = True,
    *,
    tick_s: float = 1.0,
    rate_window_s: float = 30.0,
    plan_period_s: float = 10.0,
    name: str = "fn",
) -> tuple[SimResult, int]:
    """The arrivals of `replay` (the same seeds) through the provider's live pools: one `AppPools`
    from `app_pools` (the provider's defaults: rates over 30 s, a re-plan every 10 s, the loop's
    tick of 1 s), planned once at deploy with no traffic (every app at `MIN_RATE`), then driven
    tick by tick on the cumulative counts per app. The replayed minutes' windows follow one
    another on one timeline. Each stretch of time under one plan is simulated with that plan
    (a batch still buffering when the plan changes is sent at its deadline by the old pool).
    Returns the totals and the number of plans applied (the deploy-time one included)."""
    slos = {a.name: a.slo for a in apps}
    live = app_pools(name, slos, window_s=rate_window_s, plan_period_s=plan_period_s)
    live.apply(planner(live.planned_apps(slos)), 0.0)
    arrivals: dict[str, list[np.ndarray]] = {n: [] for n in slos}
    for k, minute in enumerate(minutes):
        for i, a in enumerate(apps):
            if a.rates[minute] > 0:
                rng = np.random.default_rng([seed, minute, i])
                arrivals[a.name].append(k * window_s + poisson_arrivals(a.rates[minute], window_s, rng))
    times = {n: np.concatenate(x) if x else np.empty(0) for n, x in arrivals.items()}
    end = len(minutes) * window_s
    # the provider's loop: the plan in force from each change on
    stretches: list[tuple[float, Plan]] = [(0.0, live.plan)]  # type: ignore[list-item]
    ticks = int(math.ceil(end / tick_s - 1e-9))
    for k in range(1, ticks + 1):
        now = min(k * tick_s, end)
        live.measure(now, {n: float(np.searchsorted(x, now, side="left")) for n, x in times.items()})
        if live.replan(now, lambda: planner(live.planned_apps(slos))):
            stretches.append((now, live.plan))  # type: ignore[arg-type]
    total = SimResult()
    for j, (start, plan) in enumerate(stretches):
        stop = stretches[j + 1][0] if j + 1 < len(stretches) else math.inf
        part = {n: x[(x >= start) & (x < stop)] for n, x in times.items()}
        part = {n: x for n, x in part.items() if len(x)}
        if part:
            rng = np.random.default_rng([seed, j, 1_000_003])
            total.add(simulate_plan(plan, part, model, prices, rng, noise))
    return total, live.replans
