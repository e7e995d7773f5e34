"""The cloud a procurement daemon buys GPU nodes from (PROTEAN §4.5): an interface and back ends.

`CloudProvider` is what `faas_gpu.policies.protean.Procurement`'s driver needs of an IaaS
provider: acquire a node of a kind, release it, and the eviction notices and evictions of spot
nodes. `EmulatedCloud` is the one back end today: deterministic (seeded), it issues notices with
probability P_rev per spot node at fixed intervals, as the paper's evaluation does (§5); the
simulator and `python -m procurer` both use it. A real cloud's SDK goes behind the same
interface.
"""

from __future__ import annotations

import itertools
from typing import Protocol

import numpy as np

from faas_gpu.policies.protean.procurement import SPOT_SHARE_OF_ON_DEMAND, EvictionNotice, Node, NodeKind, PriceSeries


class CloudProvider(Protocol):
    """What procurement needs of an IaaS provider."""

    def acquire(self, kind: NodeKind, now: float) -> Node | None:
        """A new node of `kind` (ready at `ready_at`), or None when none can be had now."""

    def release(self, node: str, now: float) -> None: ...

    def eviction_notices(self, now: float) -> list[EvictionNotice]:
        """Notices issued up to `now` and not returned before."""

    def evicted(self, now: float) -> list[str]:
        """Nodes whose eviction time has come by `now` (they are gone), each once."""

    def price_per_hour(self, kind: NodeKind, now: float) -> float: ...


class EmulatedCloud:
    """A deterministic IaaS stand-in (same seed and calls, same nodes and notices).

    Every `eviction_interval_s` each ready spot node without a notice gets one with probability
    `p_rev`, evicting it uniformly `notice_s` later. Spot requests succeed with probability
    `spot_availability` (default 1 - p_rev); on-demand requests always do. Nodes are ready
    `boot_s` after they are acquired.
    """

    def __init__(
        self,
        seed: int,
        p_rev: float,
        *,
        eviction_interval_s: float = 60.0,
        notice_s: tuple[float, float] = (30.0, 120.0),
        boot_s: float = 45.0,
        spot_availability: float | None = None,
        spot_prices: PriceSeries | None = None,
        on_demand_per_hour: float = 1.0,
    ):
        if not 0 <= p_rev <= 1:
            raise ValueError(f"p_rev: must be in [0, 1], got {p_rev}")
        if not 0 < notice_s[0] <= notice_s[1]:
            raise ValueError(f"notice_s: expected 0 < low <= high, got {notice_s}")
        self.p_rev = p_rev
        self.interval = eviction_interval_s
        self.notice_s = notice_s
        self.boot_s = boot_s
        self.spot_availability = 1.0 - p_rev if spot_availability is None else spot_availability
        self.spot_prices = spot_prices or PriceSeries((SPOT_SHARE_OF_ON_DEMAND * on_demand_per_hour,), 3600.0)
        self.on_demand_per_hour = on_demand_per_hour
        acquire_seq, evict_seq = np.random.SeedSequence(seed).spawn(2)
        self._acquire_rng = np.random.default_rng(acquire_seq)
        self._evict_rng = np.random.default_rng(evict_seq)
        self._ids = itertools.count(1)
        self.nodes: dict[str, Node] = {}
        self._noticed: dict[str, EvictionNotice] = {}
        self._unreported: list[EvictionNotice] = []
        self._next_round = eviction_interval_s

    def acquire(self, kind: NodeKind, now: float) -> Node | None:
        if kind is NodeKind.SPOT and self._acquire_rng.random() >= self.spot_availability:
            return None
        node = Node(f"{kind.value}-{next(self._ids)}", kind, now, now + self.boot_s)
        self.nodes[node.id] = node
        return node

    def release(self, node: str, now: float) -> None:
        self.nodes.pop(node, None)
        self._noticed.pop(node, None)

    def _rounds(self, now: float) -> None:
        while self._next_round <= now:
            t = self._next_round
            for nid in sorted(self.nodes):
                n = self.nodes[nid]
                if n.kind is not NodeKind.SPOT or n.ready_at > t or nid in self._noticed:
                    continue
                if self._evict_rng.random() < self.p_rev:
                    lead = float(self._evict_rng.uniform(*self.notice_s))
                    notice = EvictionNotice(nid, t, t + lead)
                    self._noticed[nid] = notice
                    self._unreported.append(notice)
            self._next_round += self.interval

    def eviction_notices(self, now: float) -> list[EvictionNotice]:
        self._rounds(now)
        out, self._unreported = self._unreported, []
        return out

    def evicted(self, now: float) -> list[str]:
        self._rounds(now)
        gone = sorted(nid for nid, n in self._noticed.items() if n.evict_at <= now)
        for nid in gone:
            self.nodes.pop(nid, None)
            del self._noticed[nid]
        return gone

    def price_per_hour(self, kind: NodeKind, now: float) -> float:
        return self.spot_prices.at(now) if kind is NodeKind.SPOT else self.on_demand_per_hour
