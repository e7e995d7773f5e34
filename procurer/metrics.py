"""The procurer's `/metrics`: nodes held, the target, dollars spent and procurement events.

All of it is read at scrape time from the status the procurement loop publishes after each tick
(`Procurer.status`), so the loop counts nothing twice and the figures agree with `/status`.
Names, HELP and labels are the contract's (`faas_gpu.contract.metrics`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from faas_gpu.contract import metrics as m
from faas_gpu.observability import DaemonMetrics
from faas_gpu.policies.protean import NodeKind

KINDS = tuple(k.value for k in NodeKind)  # spot, on-demand
NODE_STATES = ("booting", "ready", "cordoned")


def read(s: dict) -> dict:
    """The samples of the procurer's metrics in one published status ({} before the first tick)."""
    if not s:
        return {}
    held = Counter((n["kind"], n["state"]) for n in s.get("nodes", []))
    cost, counts, prices = s.get("cost", {}), s.get("counts", {}), s.get("prices", {})
    events = [(("acquired", k), counts.get("acquired", {}).get(k, 0)) for k in KINDS]
    events += [(("failed", k), counts.get("failed", {}).get(k, 0)) for k in KINDS]
    events += [(("notice", ""), counts.get("notices", 0))]
    events += [((e, ""), counts.get(e, 0)) for e in ("evicted", "released")]
    price = {"spot": prices.get("spotPerHour", 0.0), "on-demand": prices.get("onDemandPerHour", 0.0)}
    return {
        m.PROCUREMENT_NODES: [((k, st), held.get((k, st), 0)) for k in KINDS for st in NODE_STATES],
        m.PROCUREMENT_TARGET_NODES: [((), s.get("targetNodes", 0))],
        m.PROCUREMENT_DOLLARS: [((k,), cost.get("dollars", {}).get(k, 0.0)) for k in KINDS],
        m.PROCUREMENT_ON_DEMAND_EQUIVALENT: [((), cost.get("onDemandEquivalent", 0.0))],
        m.PROCUREMENT_PRICE: [((k,), price.get(k, 0.0)) for k in KINDS],
        m.PROCUREMENT_EVENTS: events,
    }


def procurer_metrics(status: Callable[[], dict]) -> DaemonMetrics:
    """The procurer's metrics over `status` (`Procurer.status`)."""
    metrics = DaemonMetrics(m.Daemon.PROCURER)
    metrics.add_reader(lambda: read(status()))
    return metrics
