"""The containers of each model on each node, scaled by PROTEAN's autoscaler (`ProteanScaling`:
one container per batch, delayed termination) for every scheme alike, with cold starts."""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from faas_gpu.policies.protean import FunctionLoad, ScaleSnapshot, SlowdownModel

from .model import Containers, Node
from .workload import Workload


class ContainerAutoscaler:
    """Drives each node's `ProteanScaling` on the node's queued and running batches; a container
    started takes `cold_start_s` to be warm, then `on_warm(node)` lets the node serve again."""

    def __init__(
        self,
        env: simpy.Environment,
        slowdown: SlowdownModel,
        cold_start_s: float,
        on_warm: Callable[[Node], None],
    ):
        self.env, self.sd, self.cold_start_s, self.on_warm = env, slowdown, cold_start_s, on_warm
        self.cold_starts = 0

    def prewarm(self, node: Node, workload: Workload, n_nodes: int) -> None:
        """Containers as the expected load per node asks for (the cluster has run before t = 0)."""
        w = workload
        rate = w.trace.rates[0] if len(w.trace.rates) else 0.0
        models = ([w.strict_model] if w.strict_model else []) + list(w.be_models)
        for m in dict.fromkeys(models):
            spec = self.sd.spec(m)
            share = w.strict_share if m == w.strict_model else (1 - w.strict_share) / max(1, len(w.be_models))
            per_node = rate * share / spec.batch / n_nodes * spec.exec_7g_s
            node.containers.setdefault(m, Containers()).warm = math.ceil(2 * per_node) + 1

    def idle(self, node: Node, model: str) -> int:
        """Warm containers of `model` on `node` with no batch."""
        c = node.containers.get(model)
        return c.warm - c.busy if c else 0

    def autoscale(self, node: Node) -> None:
        waiting = {m: n for m, n in node.waiting.items() if n}
        loads = {}
        for m, c in node.containers.items():
            b = self.sd.spec(m).batch
            loads[m] = FunctionLoad(m, b, waiting.get(m, 0) * b, c.busy, c.warm + c.starting)
        for m, n in waiting.items():
            if m not in loads:
                node.containers[m] = Containers()
                b = self.sd.spec(m).batch
                loads[m] = FunctionLoad(m, b, n * b, 0, 0)
        decision = node.scaler.observe(ScaleSnapshot(loads), self.env.now)
        for m, n in decision.scale_up.items():
            node.containers[m].starting += n
            self.cold_starts += n
            self.env.process(self._start(node, m, n))
        for m, n in decision.terminate.items():
            c = node.containers[m]
            c.warm -= min(n, c.warm - c.busy)

    def _start(self, node: Node, model: str, n: int):
        yield self.env.timeout(self.cold_start_s)
        c = node.containers[model]
        c.starting -= n
        c.warm += n
        if node.state == "ready":
            self.on_warm(node)
