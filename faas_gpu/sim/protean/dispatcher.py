"""The dispatcher in front of the nodes and the bookkeeping of each node's queue.

Every scheme gets the same dispatcher: the node where the fewest batches are ahead of this one in
that node's serving order (all of them where service is class-blind, only the strict ones for a
strict batch under PROTEAN, whose best-effort work waits behind strict work).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from faas_gpu.policies.protean import ClassQueue, admission_queue

from .model import Job, Node


class Dispatcher:
    """Sends each batch to a node's queue and keeps the counts the autoscaler, Alg. 1 and the
    monitor read; `on_queued(node)` runs after a batch joins `node`'s queue."""

    def __init__(
        self,
        env: simpy.Environment,
        nodes: list[Node],
        *,
        class_aware: bool,
        on_queued: Callable[[Node], None],
    ):
        self.env, self.nodes, self.class_aware, self.on_queued = env, nodes, class_aware, on_queued
        self.pending: deque[Job] = deque()  # batches with no node to go to

    def dispatch(self, j: Job) -> None:
        ready = [n for n in self.nodes if n.state == "ready"]
        if not ready:  # nothing serves: wait on the least-loaded node that will come back
            ready = [n for n in self.nodes if n.state in ("draining", "reconfiguring", "booting")]
        if not ready:  # no node at all (every spot node evicted): wait for one at the cluster
            self.pending.append(j)
            return
        node = min(ready, key=lambda n: (self.ahead(n, j), n.outstanding, n.last_assigned, n.id))
        node.last_assigned = self.env.now
        if not j.strict:
            node.be_model = j.model
        self.resident(node, j.strict, +1)
        if isinstance(node.queue, ClassQueue):
            node.queue.push(j, j.arrival, j.deadline)
        else:
            node.queue.append(j)
        self.enqueued(node, j, +1)
        self.on_queued(node)

    def dispatch_pending(self) -> None:
        """A node came up: the batches that had nowhere to go are dispatched."""
        while self.pending:
            self.dispatch(self.pending.popleft())

    def ahead(self, node: Node, j: Job) -> int:
        """Batches that delay `j` on `node`: all of them where service is class-blind; for PROTEAN's
        strict batches, only the strict ones (best-effort work waits behind them, on other slices)."""
        if self.class_aware and j.strict:
            return node.resident[True]
        return node.outstanding

    def withdraw(self, node: Node) -> list[Job]:
        """Take every queued job off `node` (to dispatch elsewhere)."""
        jobs = self.queued(node)
        if isinstance(node.queue, ClassQueue):
            node.queue = admission_queue(node.queue.be_max_wait_s, node.queue.be_share)
        else:
            node.queue.clear()
        for j in jobs:
            self.resident(node, j.strict, -1)
        node.waiting, node.queued_be_mb = {}, 0.0
        return jobs

    def queued(self, node: Node) -> list[Job]:
        if isinstance(node.queue, ClassQueue):
            return [e.item for e in node.queue.entries()]
        return list(node.queue)

    def resident(self, node: Node, strict: bool, delta: int) -> None:
        """Batches queued or running on the node, by class, integrated over time for the monitor."""
        now = self.env.now
        for c in (True, False):
            node.area[c] += node.resident[c] * (now - node.area_t)
        node.area_t = now
        node.resident[strict] += delta

    def enqueued(self, node: Node, j: Job, delta: int) -> None:
        """Keep the node's queued counts (the autoscaler and Alg. 1 read them at every event)."""
        node.waiting[j.model] = node.waiting.get(j.model, 0) + delta
        if not j.strict:
            node.queued_be_mb += delta * j.mem_mb
