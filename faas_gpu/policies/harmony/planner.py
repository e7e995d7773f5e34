"""HarmonyBatch's two-stage merging (Alg. 1) and the `plan` entry point for all three strategies.

Alg. 1 starts with one group per app, each provisioned by funcProvision, and keeps the groups in
a list sorted by SLO, since merging apps of distant SLOs shrinks the equivalent timeout (Eq. 5).
Stage 1 walks runs of adjacent CPU groups and, once a run's rate passes the knee rate r* (the
rate above which one app of the run's tightest SLO is cheaper on a GPU, Fig. 7), merges the run.
The test r > r* is asked as "would one such app at rate r go to a GPU?", which is the same
question when there is one knee, as Fig. 7 finds, and needs one funcProvision, not a bisection.
Stage 2 merges every GPU group with its right neighbour for as long as that lowers the cost. A
merge is kept only when the merged group costs less per second than its parts.

`plan(apps, model, prices, strategy)` is pure: the same inputs give the same plan. A
`Provisioner` (per model, prices, platform and timeout formula) is reused between calls for
what does not depend on the apps (the knee rates, the roots of Eq. 14).

The modules form a line, not a circle: `planner` calls `baselines`, and both take `Options` from
`options` and `sort_by_slo` from `plans`, below them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from faas_gpu.contract.annotations import HARMONY_STRATEGIES

from .baselines import batch, mbs
from .cost import Prices
from .models import ModelCoefficients
from .options import Options
from .plans import App, Group, Plan, sort_by_slo
from .platform import Platform
from .provision import KINDS, InfeasibleSLOError, Load, Provisioner

STRATEGIES = HARMONY_STRATEGIES  # what com.faas-gpu.harmony-strategy may name
DEFAULT_OPTIONS = Options()  # the paper's choices (Eq. 5, any kind for a merged group)


@lru_cache(maxsize=64)
def provisioner(
    model: ModelCoefficients, prices: Prices, platform: Platform, timeout_formula: str = "eq5"
) -> Provisioner:
    """One Provisioner per (model, prices, platform, formula): its caches are pure functions of those."""
    return Provisioner(model, prices, platform, timeout_formula)


def provision_app(prov: Provisioner, app: App, kinds: Sequence[str] = KINDS) -> Group:
    """funcProvision for one app alone; InfeasibleSLOError when nothing meets its SLO."""
    p = prov.best(Load((app.slo,), (app.rate,)), kinds)
    if p is None:
        best, where = prov.best_latency(kinds)
        raise InfeasibleSLOError(app.name, app.slo, best, where)
    return Group((app,), p)


def _merge(prov: Provisioner, groups: list[Group], low: int, high: int, kinds: Sequence[str]) -> bool:
    """Merge of Alg. 1 (lines 23-30): groups[low:high] become one group if that is cheaper."""
    parts = groups[low:high]
    if len(parts) < 2:
        return False
    apps = tuple(a for g in parts for a in g.apps)
    p = prov.best(Load(tuple(a.slo for a in apps), tuple(a.rate for a in apps)), kinds)
    if p is None:
        return False
    merged = Group(apps, p)
    if merged.cost_per_second < sum(g.cost_per_second for g in parts):
        groups[low:high] = [merged]
        return True
    return False


def harmony(
    apps: Sequence[App], prov: Provisioner, options: Options = DEFAULT_OPTIONS
) -> tuple[list[Group], list[float]]:
    """Alg. 1. Returns the groups and the plan's cost per second after each step (initial, then each merge)."""
    groups = [provision_app(prov, a) for a in sort_by_slo(apps)]
    trace = [sum(g.cost_per_second for g in groups)]
    kinds = options.merged_kinds

    # Stage 1: merge runs of CPU groups whose rate passes the knee of the run's tightest SLO
    i = j = 0
    r = 0.0
    while i < len(groups):
        if groups[i].kind == "cpu":
            r += groups[i].rate
            if prov.past_knee(groups[j].slo, r):  # r > r* of the run's tightest SLO
                if _merge(prov, groups, j, i + 1, kinds):
                    trace.append(sum(g.cost_per_second for g in groups))
                i, j, r = j, j + 1, 0.0
        else:
            j, r = i + 1, 0.0
        i += 1

    # Stage 2: merge GPU groups with their neighbours while it pays
    i = 0
    while i < len(groups) - 1:
        if groups[i].kind == "gpu" or groups[i + 1].kind == "gpu":
            if _merge(prov, groups, i, i + 2, kinds):
                trace.append(sum(g.cost_per_second for g in groups))
                i -= 1
        i += 1
    return groups, trace


def plan(
    apps: Sequence[App],
    model: ModelCoefficients,
    prices: Prices,
    strategy: str = "harmony",
    platform: Platform | None = None,
    options: Options | None = None,
) -> Plan:
    """Group `apps` (all serving `model`) onto CPU/GPU functions with `strategy`: harmony, batch or mbs."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    if not apps:
        return Plan(strategy, ())
    names = [a.name for a in apps]
    if len(set(names)) != len(names):
        raise ValueError("apps must have distinct names")
    platform = platform or Platform()
    options = options or Options()
    if strategy == "batch":
        prov = provisioner(model.as_deterministic(), prices, platform, options.timeout_formula)
        return Plan(strategy, tuple(batch(apps, prov)))
    prov = provisioner(model, prices, platform, options.timeout_formula)
    if strategy == "mbs":
        return Plan(strategy, tuple(mbs(apps, prov, options)))
    groups, _ = harmony(apps, prov, options)
    return Plan(strategy, tuple(groups))
