"""Cost-aware procurement: spot nodes when there are any, on-demand as the backup (PROTEAN §4.5).

- Nodes are acquired as spot VMs; a spot request that fails is retried as on-demand.
- On an eviction notice (30-120 s ahead) the node is cordoned (nothing new is placed on it),
  drained (its batches finish: they run for well under a second), and a replacement is
  acquired at once, spot first. Once a cordoned node is idle it is released.
- While on-demand nodes serve, spot is tried again every `spot_retry_s`; a spot node that comes
  up replaces an on-demand one (cordon, drain, release), so on-demand is only the backup.
- `mode="spot-only"` (the paper's *Spot Only*) never buys on-demand; `mode="on-demand"`
  never buys spot (the other schemes' set-up).

`CostMeter` prices node time with a spot price series (cocktail's `spot.csv`) and a constant
on-demand price. The cloud itself (the `CloudProvider` interface the daemon and the simulator
drive, and the emulated back end) is `faas_gpu.cloud`: a real back end does I/O, a policy does not.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

SPOT_SHARE_OF_ON_DEMAND = 0.30  # AWS 8xA100 spot 9.8318 vs on-demand 32.7726 $/h (PROTEAN Table 3)


class NodeKind(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True)
class Node:
    id: str
    kind: NodeKind
    requested_at: float
    ready_at: float


@dataclass(frozen=True)
class EvictionNotice:
    node: str
    noticed_at: float
    evict_at: float


# -- prices and cost --------------------------------------------------------------------------


@dataclass(frozen=True)
class PriceSeries:
    """A step function of $/h, `step_s` per value, cycled past its end."""

    values: tuple[float, ...]
    step_s: float

    def __post_init__(self) -> None:
        if not self.values or self.step_s <= 0:
            raise ValueError("PriceSeries: needs values and step_s > 0")

    @classmethod
    def from_csv_text(cls, text: str, column: str, step_s: float, scale: float = 1.0) -> PriceSeries:
        rows = list(csv.DictReader(io.StringIO(text)))
        if not rows or column not in rows[0]:
            raise ValueError(f"spot prices: no column {column!r}")
        return cls(tuple(float(r[column]) * scale for r in rows), step_s)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def at(self, t: float) -> float:
        return self.values[int(t // self.step_s) % len(self.values)]

    def integral_hours(self, start: float, end: float) -> float:
        """$ for one node over [start, end) (seconds)."""
        total, t = 0.0, start
        while t < end:
            nxt = min(end, (math.floor(t / self.step_s) + 1) * self.step_s)
            total += self.at(t) * (nxt - t) / 3600.0
            t = nxt
        return total


@dataclass
class CostMeter:
    spot: PriceSeries
    on_demand_per_hour: float
    dollars: dict[NodeKind, float] = field(default_factory=lambda: {k: 0.0 for k in NodeKind})
    node_seconds: dict[NodeKind, float] = field(default_factory=lambda: {k: 0.0 for k in NodeKind})

    def add(self, kind: NodeKind, start: float, end: float) -> float:
        """Charge one node of `kind` held over [start, end); returns the $ added."""
        if end <= start:
            return 0.0
        cost = (
            self.spot.integral_hours(start, end)
            if kind is NodeKind.SPOT
            else self.on_demand_per_hour * (end - start) / 3600.0
        )
        self.dollars[kind] += cost
        self.node_seconds[kind] += end - start
        return cost

    @property
    def total(self) -> float:
        return sum(self.dollars.values())

    def on_demand_equivalent(self) -> float:
        """What the same node time would have cost all on-demand."""
        return self.on_demand_per_hour * sum(self.node_seconds.values()) / 3600.0


# -- the policy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeState:
    id: str
    kind: NodeKind
    ready: bool  # booted
    cordoned: bool = False  # nothing new is placed; draining
    idle: bool = False  # no batch running or queued on it


@dataclass(frozen=True)
class ProcurementSnapshot:
    nodes: Sequence[NodeState]  # every live node, booting ones included
    notices: Sequence[EvictionNotice] = ()  # new since the last observe
    failed: Sequence[NodeKind] = ()  # acquisitions that failed since the last observe


@dataclass
class ProcurementDecision:
    cordon: list[str] = field(default_factory=list)
    acquire: list[NodeKind] = field(default_factory=list)
    release: list[str] = field(default_factory=list)


class Procurement:
    """Keeps `target_nodes` serving nodes, spot first (see the module docstring)."""

    MODES = ("hybrid", "spot-only", "on-demand")

    def __init__(self, target_nodes: int, mode: str = "hybrid", spot_retry_s: float = 60.0):
        if mode not in self.MODES:
            raise ValueError(f"mode: expected one of {', '.join(self.MODES)}, got {mode!r}")
        if target_nodes < 0:
            raise ValueError(f"target_nodes: must be >= 0, got {target_nodes}")
        self.target_nodes, self.mode, self.spot_retry_s = target_nodes, mode, spot_retry_s
        self._last_spot_failure = -math.inf
        self._cordoned: set[str] = set()

    def observe(self, snapshot: ProcurementSnapshot, now: float) -> ProcurementDecision:
        out = ProcurementDecision()
        live = {n.id: n for n in snapshot.nodes}
        self._cordoned &= set(live)
        for notice in snapshot.notices:
            if notice.node in live and notice.node not in self._cordoned:
                self._cordoned.add(notice.node)
                out.cordon.append(notice.node)
        spot_failures = sum(1 for k in snapshot.failed if k is NodeKind.SPOT)
        if spot_failures:
            self._last_spot_failure = now
        serving = [n for n in snapshot.nodes if n.id not in self._cordoned and not n.cordoned]
        deficit = self.target_nodes - len(serving)
        for i in range(max(0, deficit)):
            out.acquire.append(self._kind_for_new(fallback=i < spot_failures, now=now))
        if self.mode == "spot-only":
            out.acquire = [k for k in out.acquire if k is NodeKind.SPOT]
            if now - self._last_spot_failure < self.spot_retry_s:
                out.acquire = []
        ready = [n for n in serving if n.ready]
        if len(ready) > self.target_nodes:  # surplus once the newcomers are up: retire on-demand first
            for n in sorted(ready, key=lambda n: (n.kind is NodeKind.SPOT, n.id))[: len(ready) - self.target_nodes]:
                self._cordoned.add(n.id)
                out.cordon.append(n.id)
        elif (
            deficit == 0
            and self.mode == "hybrid"
            and now - self._last_spot_failure >= self.spot_retry_s
            and any(n.kind is NodeKind.ON_DEMAND for n in serving)
            and all(n.ready for n in serving)
        ):
            out.acquire.append(NodeKind.SPOT)  # try to move one on-demand node back to spot
        for n in snapshot.nodes:
            if (n.id in self._cordoned or n.cordoned) and n.idle:
                out.release.append(n.id)
        return out

    def _kind_for_new(self, fallback: bool, now: float) -> NodeKind:
        if self.mode == "on-demand":
            return NodeKind.ON_DEMAND
        if self.mode == "spot-only":
            return NodeKind.SPOT
        if fallback or now - self._last_spot_failure < self.spot_retry_s:
            return NodeKind.ON_DEMAND
        return NodeKind.SPOT
