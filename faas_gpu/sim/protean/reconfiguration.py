"""PROTEAN's monitor and GPU reconfiguration in the simulation: every `monitor_s` the nodes'
resident load by class goes to the Reconfigurator (Alg. 2); a node told to change drains, then
is down `reconfig_s` (~2 s) while its MIG geometry changes. The time each geometry was held is
counted for every scheme."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from faas_gpu.policies.protean import GpuObservation
from faas_gpu.policies.protean.reconfigurator import Reconfigurator

from .dispatcher import Dispatcher
from .gpu import Gpus
from .model import Node


class GeometryControl:
    """Drives the Reconfigurator and applies its decisions to the nodes; `serve(node)` lets a
    node serve again, `finished()` says the run is over."""

    def __init__(
        self,
        env: simpy.Environment,
        nodes: list[Node],
        reconfigurator: Reconfigurator,
        dispatcher: Dispatcher,
        gpus: Gpus,
        *,
        monitor_s: float,
        reconfig_s: float,
        strict_model: str | None,
        serve: Callable[[Node], None],
        finished: Callable[[], bool],
    ):
        self.env, self.nodes, self.reconfigurator = env, nodes, reconfigurator
        self.dispatcher, self.gpus = dispatcher, gpus
        self.monitor_s, self.reconfig_s, self.strict_model = monitor_s, reconfig_s, strict_model
        self.serve, self.finished = serve, finished
        self.reconfigurations = 0
        self.geometry_time: dict[tuple[str, ...], float] = {}

    def monitor(self):
        """The monitor's simpy process (PROTEAN only)."""
        env = self.env
        while not self.finished():
            yield env.timeout(self.monitor_s)
            live = [n for n in self.nodes if n.state in ("ready", "draining", "reconfiguring")]
            obs = []
            for n in live:
                self.dispatcher.resident(n, False, 0)
                mean = {c: n.area[c] / self.monitor_s for c in (True, False)}
                n.area = {True: 0.0, False: 0.0}
                alpha = self.reconfigurator.settings.ewma_alpha
                n.strict_pred = alpha * mean[True] + (1 - alpha) * n.strict_pred
                obs.append(
                    GpuObservation(
                        n.id,
                        n.geometry,
                        mean[False],
                        n.be_model,
                        n.state != "ready",
                        mean[True],
                        self.strict_model,
                    )
                )
            for n in live:  # the strict reservation may have shrunk: what waited for it may start now
                self.serve(n)
            decision = self.reconfigurator.observe(obs, env.now)
            for r in decision.reconfigure:
                node = self.nodes[r.gpu]
                node.state, node.target = "draining", r.target
                self.reconfigurations += 1
                for j in self.dispatcher.withdraw(node):
                    self.dispatcher.dispatch(j)
                if node.running == 0:
                    self.reconfigure(node)

    def reconfigure(self, node: Node) -> None:
        """The drained `node` goes down and comes back with its target geometry."""
        self.env.process(self._reconfigure(node))

    def _reconfigure(self, node: Node):
        node.state = "reconfiguring"
        yield self.env.timeout(self.reconfig_s)
        if node.state != "reconfiguring":
            return
        for u in node.units:
            self.gpus.shut(u)
        self.account(node)
        node.geometry = node.target or node.geometry
        node.units = self.gpus.make_units(node.id, node.geometry)
        node.state = "ready"
        self.serve(node)

    def account(self, node: Node) -> None:
        """Charge the time since the last change to `node`'s current geometry."""
        g = tuple(node.geometry)
        self.geometry_time[g] = self.geometry_time.get(g, 0.0) + self.env.now - node.since
        node.since = self.env.now
