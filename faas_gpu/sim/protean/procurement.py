"""PROTEAN's spot/on-demand procurement in the simulation: an emulated cloud that revokes spot
nodes with probability `p_rev` (with notice), the `Procurement` policy that cordons, buys and
releases nodes, and the bill."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from faas_gpu.cloud import EmulatedCloud
from faas_gpu.policies.protean import (
    Assumptions,
    CostMeter,
    NodeKind,
    NodeState,
    PriceSeries,
    Procurement,
    ProcurementSnapshot,
)

from .dispatcher import Dispatcher
from .gpu import Gpus
from .model import Node


@dataclass(frozen=True)
class SpotSetting:
    """Run with spot/on-demand procurement (`mode` as `Procurement`) under revocation probability `p_rev`."""

    p_rev: float
    mode: str = "hybrid"
    spot_prices: PriceSeries | None = None
    on_demand_per_hour: float = 1.0


class SpotCluster:
    """The cluster's nodes as bought from the emulated cloud: the nodes standing at t = 0, the
    procurement loop (evictions, cordons, purchases, releases, boots) and what they cost.
    `add_node(state)` makes a node with its units and containers; `serve(node)` lets it serve."""

    def __init__(
        self,
        env: simpy.Environment,
        spot: SpotSetting,
        a: Assumptions,
        seed: int,
        n_nodes: int,
        nodes: list[Node],
        dispatcher: Dispatcher,
        gpus: Gpus,
        *,
        add_node: Callable[[str], Node],
        serve: Callable[[Node], None],
        finished: Callable[[], bool],
    ):
        self.env, self.spot, self.n_nodes, self.nodes = env, spot, n_nodes, nodes
        self.dispatcher, self.gpus = dispatcher, gpus
        self.add_node, self.serve, self.finished = add_node, serve, finished
        lo, hi = a.setting("simulator", "notice_s")
        self.cloud = EmulatedCloud(
            seed,
            spot.p_rev,
            eviction_interval_s=float(a.setting("simulator", "eviction_interval_s")),
            notice_s=(float(lo), float(hi)),
            boot_s=float(a.setting("simulator", "vm_boot_s")),
            spot_prices=spot.spot_prices,
            on_demand_per_hour=spot.on_demand_per_hour,
        )
        self.procurement = Procurement(n_nodes, spot.mode)
        self.costs: list[tuple[NodeKind, float, float]] = []

    def start(self) -> None:
        """Buy the cluster as it stands at t = 0 and start the procurement loop."""
        mode = self.spot.mode
        boot = self.cloud.boot_s
        for _ in range(self.n_nodes):
            kind = NodeKind.ON_DEMAND if mode == "on-demand" else NodeKind.SPOT
            got = self.cloud.acquire(kind, -boot)
            if got is None and mode == "hybrid":
                got = self.cloud.acquire(NodeKind.ON_DEMAND, -boot)
            if got is None:
                continue
            node = self.add_node("ready")
            node.cloud_id, node.kind, node.acquired_at = got.id, got.kind, 0.0
        self.env.process(self._procure())

    def _procure(self):
        env, cloud, policy = self.env, self.cloud, self.procurement
        failed: list[NodeKind] = []
        while not self.finished():
            now = env.now
            for nid in cloud.evicted(now):
                node = self._by_cloud(nid)
                if node is None:
                    continue
                self._retire(node, now)
            notices = cloud.eviction_notices(now)
            states = [
                NodeState(
                    n.cloud_id or "",
                    n.kind,
                    n.state != "booting",
                    n.state == "cordoned",
                    n.state == "cordoned" and n.running == 0 and not n.queue,
                )
                for n in self.nodes
                if n.state != "gone"
            ]
            decision = policy.observe(ProcurementSnapshot(states, notices, failed), now)
            failed = []
            for cid in decision.cordon:
                node = self._by_cloud(cid)
                if node is not None and node.state != "gone":
                    node.state = "cordoned"
                    for j in self.dispatcher.withdraw(node):
                        self.dispatcher.dispatch(j)
            for kind in decision.acquire:
                got = cloud.acquire(kind, now)
                if got is None:
                    failed.append(kind)
                    continue
                node = self.add_node("booting")
                node.cloud_id, node.kind, node.acquired_at = got.id, got.kind, now
                env.process(self._boot(node, got.ready_at - now))
            for cid in decision.release:
                node = self._by_cloud(cid)
                if node is not None:
                    cloud.release(cid, now)
                    self._retire(node, now)
            yield env.timeout(1.0)

    def _boot(self, node: Node, delay: float):
        yield self.env.timeout(max(0.0, delay))
        if node.state == "booting":
            node.state = "ready"
            self.dispatcher.dispatch_pending()
            self.serve(node)

    def _by_cloud(self, cid: str) -> Node | None:
        return next((n for n in self.nodes if n.cloud_id == cid and n.state != "gone"), None)

    def _retire(self, node: Node, now: float) -> None:
        """The node is gone (released or evicted): charge it; batches still on it run again elsewhere."""
        self.costs.append((node.kind, node.acquired_at, now))
        node.state = "gone"
        lost = [j for u in node.units for j in u.jobs]
        for u in node.units:
            u.jobs, u.used_mb = [], 0.0
            self.gpus.shut(u)
        node.running = 0
        for j in self.dispatcher.withdraw(node) + lost:
            self.dispatcher.dispatch(j)

    def cost(self, end: float) -> dict[str, float]:
        """The bill at `end`, the nodes still held charged up to then."""
        for n in self.nodes:
            if n.state != "gone":
                self.costs.append((n.kind, n.acquired_at, end))
        meter = CostMeter(self.cloud.spot_prices, self.spot.on_demand_per_hour)
        for kind, start, stop in self.costs:
            meter.add(kind, max(0.0, start), stop)
        baseline = self.n_nodes * self.spot.on_demand_per_hour * end / 3600.0
        node_s = sum(meter.node_seconds.values())
        return {
            "dollars": meter.total,
            "normalized": meter.total / baseline if baseline else math.nan,
            "spot_share": meter.node_seconds[NodeKind.SPOT] / node_s if node_s else 0.0,
        }
