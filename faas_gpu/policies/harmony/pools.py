"""HarmonyBatch's live pools: the per-app rate window, the re-plan rule and the pools a plan becomes.

What the provider's HarmonyBatch scaling (`provider.scaling.harmony`) decides with, and what the
simulator (`faas_gpu.sim.harmony.replay_live`) replays, built by one factory (`app_pools`):

- **Rate window**: each observation is the cumulative count of requests per app at `now`; the
  rate of an app is the count's growth over the samples of the last `window_s` (at least two
  samples are kept, so a long gap still gives a rate).
- **Re-plan rule**: every `plan_period_s` the planner runs on those rates; its plan replaces
  the current one only when it `differs`: other groups, or a batch size off by a quarter or
  more (each applied change replaces instances, so small wobbles wait for a real shift of load).
- **Pools**: one per group of the plan, named after the function, the kind and the apps; an
  app split over several groups (MBS+) takes each group's part of its rate.
- **Copies under a floor** (`spread`): a scale request's floor on the instances; the instances
  beyond one per pool are copies of the pool with the most load per copy, each copy taking an
  equal part of its pool's rates (`weights`, what the gateway's weighted split uses).

Pure: the time and the counts come in as arguments; the planner is the caller's callable.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .plans import App, Plan

MIN_RATE = 0.05  # an app with no traffic yet is planned as a trickle, not left out


@dataclass
class Pool:
    """One group of the plan as instances: the group's configuration (`Group.to_dict`), the part
    of each app's rate it takes, and how many instances run it."""

    id: str
    group: dict
    apps: dict[str, float]  # app -> share of the app's rate this pool takes
    copies: int = 1  # instances of this pool (more than one under a scale request's floor)

    @property
    def instance_ids(self) -> list[str]:
        return [self.id] + [f"{self.id[:56]}-r{i}" for i in range(2, self.copies + 1)]


def shape(p: Plan) -> dict[tuple[str, tuple[str, ...]], int]:
    """(kind, apps) -> batch size of each group of a plan."""
    return {(g.kind, tuple(sorted({a.name for a in g.apps}))): g.batch for g in p.groups}


def differs(old: Plan | None, new: Plan) -> bool:
    """Worth restarting pools for: other groups, or a batch size off by a quarter or more."""
    if old is None:
        return True
    a, b = shape(old), shape(new)
    if a.keys() != b.keys():
        return True
    return any(abs(b[k] - a[k]) >= max(1, 0.25 * a[k]) for k in a)


def pools_of(name: str, new: Plan) -> list[Pool]:
    """The pools of a plan for function `name` (ids at most 60 characters, unique)."""
    pools: list[Pool] = []
    for g in new.groups:
        names = [a.name for a in g.apps]
        pid = f"{name}-{g.kind}-" + "-".join(sorted(set(names)))
        shares: dict[str, float] = {}
        for a in g.apps:  # MBS+ may split one app over several groups
            shares[a.name] = shares.get(a.name, 0.0) + a.rate
        while any(p.id == pid for p in pools):
            pid += "x"
        pools.append(Pool(pid[:60], g.to_dict(), shares))
    return pools


@dataclass
class AppPools:
    """One function's live pools (see the module's docstring); built by `app_pools`."""

    name: str
    apps: tuple[str, ...]
    window_s: float
    plan_period_s: float
    samples: deque = field(default_factory=lambda: deque(maxlen=256))
    rates: dict[str, float] = field(default_factory=dict)
    plan: Plan | None = None
    pools: list[Pool] = field(default_factory=list)
    planned_at: float = -math.inf
    floor: int = 0  # instances a scale request asked for (0: one per pool)
    replans: int = 0  # plans applied

    def keep_from(self, old: AppPools) -> None:
        """An update with the same apps and model keeps the measured rates and the floor."""
        self.samples, self.rates, self.floor = old.samples, old.rates, old.floor

    def measure(self, now: float, arrived: Mapping[str, float]) -> dict[str, float]:
        """Take the cumulative counts per app at `now`; the rates over the window (req/s)."""
        self.samples.append((now, dict(arrived)))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        (t0, a0), (t1, a1) = self.samples[0], self.samples[-1]
        if t1 > t0:
            self.rates = {n: (a1.get(n, 0) - a0.get(n, 0)) / (t1 - t0) for n in self.apps}
        return self.rates

    def planned_apps(self, slos: Mapping[str, float]) -> list[App]:
        """The planner's input: every app with its SLO (s) at its measured rate, `MIN_RATE` at least."""
        return [App(n, slo, max(MIN_RATE, self.rates.get(n, 0.0))) for n, slo in slos.items()]

    def due(self, now: float) -> bool:
        """A plan period has passed since the last plan (applied or not)."""
        return now - self.planned_at >= self.plan_period_s

    def replan(self, now: float, planner: Callable[[], Plan | None]) -> bool:
        """When `due`: plan again and `offer` the plan. True when a plan was applied."""
        if not self.due(now):
            return False
        return self.offer(planner(), now)

    def offer(self, new: Plan | None, now: float) -> bool:
        """This period's plan (None: no plan, keep the current one): applied if it `differs`.
        True when it was applied."""
        self.planned_at = now
        if new is None or not differs(self.plan, new):
            return False
        self.apply(new, now)
        return True

    def apply(self, new: Plan, now: float) -> None:
        """Make `new` the plan: its pools, spread under the floor."""
        self.planned_at = now
        self.plan, self.pools = new, pools_of(self.name, new)
        self.replans += 1
        self.spread()

    def spread(self, floor: int | None = None) -> None:
        """Copies of the pools up to the floor (a new `floor` when given), each next one for the
        pool with the most load per copy."""
        if floor is not None:
            self.floor = floor
        pools = self.pools
        for p in pools:
            p.copies = 1
        for _ in range(max(0, self.floor - len(pools))):
            busiest = max(pools, key=lambda p: sum(p.apps.values()) / p.copies)
            busiest.copies += 1

    def weights(self, app: str) -> dict[str, float]:
        """Instance id -> the part of `app`'s rate it takes (the gateway's weighted split)."""
        return {i: p.apps[app] / p.copies for p in self.pools if app in p.apps for i in p.instance_ids}


def app_pools(name: str, apps, *, window_s: float = 30.0, plan_period_s: float = 10.0) -> AppPools:
    """A function's live pools, as the provider (`HarmonyPools`) and the simulator build them."""
    return AppPools(name, tuple(apps), window_s, plan_period_s)
