"""How a node serves its queue, the one thing the schemes differ in (paper §5):

- `molecule_beta`: the whole GPU, time-shared: one batch at a time, in arrival order.
- `infless_llama`: the whole GPU shared through MPS by every batch that fits its memory.
- `naive_slicing`: a static (4g, 3g) geometry, MPS within each slice, each batch to the slice
  with the least memory load (used / size), whatever its class.
- `protean`: the classes queue (strict EDF first, bounded BE wait) and Job Distribution (Alg. 1),
  with a strict reservation predicted by the monitor (`Node.strict_pred`).

A batch starts only where a warm container of its model is idle.
"""

from __future__ import annotations

import math
from collections import deque

from faas_gpu.policies.protean import Batch, ClassQueue, JobDistributor, Queued, SliceState, SlowdownModel

from .containers import ContainerAutoscaler
from .dispatcher import Dispatcher
from .gpu import Gpus
from .model import Job, Node, Unit


class Serving:
    """Starts a node's queued batches on its units when they can start (one subclass per kind)."""

    def __init__(self, dispatcher: Dispatcher, gpus: Gpus, containers: ContainerAutoscaler):
        self.dispatcher, self.gpus, self.containers = dispatcher, gpus, containers
        self.env = gpus.env

    def serve(self, node: Node) -> None:
        if node.state != "ready" or not node.queue:
            return
        self._serve(node)

    def _serve(self, node: Node) -> None:
        raise NotImplementedError

    def _start(self, node: Node, u: Unit, j: Job) -> None:
        """Run `j`, taken off `node`'s queue, on unit `u`."""
        self.dispatcher.enqueued(node, j, -1)
        node.running += 1
        node.containers[j.model].busy += 1
        self.gpus.run(u, j, node.id)


class ClassBlindServing(Serving):
    """The baselines: first come, first served, whatever the class (`scheme` says where a batch fits)."""

    def __init__(self, scheme: str, dispatcher: Dispatcher, gpus: Gpus, containers: ContainerAutoscaler):
        super().__init__(dispatcher, gpus, containers)
        self.scheme = scheme

    def _serve(self, node: Node) -> None:
        q: deque[Job] = node.queue  # type: ignore[assignment]
        keep: deque[Job] = deque()
        while q:
            j = q.popleft()
            u = self._choose_unit(node, j) if self.containers.idle(node, j.model) > 0 else None
            if u is None:
                keep.append(j)
                if self.scheme == "molecule_beta" and node.units[0].jobs:
                    break  # the GPU is busy: nothing behind can start either
                continue
            self._start(node, u, j)
        keep.extend(q)
        node.queue = keep

    def _choose_unit(self, node: Node, j: Job) -> Unit | None:
        if self.scheme == "molecule_beta":
            u = node.units[0]
            return u if not u.jobs else None
        fits = [u for u in node.units if u.memory_mb - u.used_mb >= j.mem_mb]
        if not fits:
            return None
        if self.scheme == "infless_llama":
            return fits[0]
        # naive slicing: least memory load, ties to the larger slice
        return min(fits, key=lambda u: (u.used_mb / u.memory_mb, -u.memory_mb, u.id))


class ProteanServing(Serving):
    """PROTEAN: the class queue's serving order, then Job Distribution (Alg. 1) over the slices.

    `extended` turns on our extensions (the strict reservation from the monitor's prediction, no
    Guideline 1 reservation when no strict function is deployed); `protean_paper` runs without.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        gpus: Gpus,
        containers: ContainerAutoscaler,
        distributor: JobDistributor,
        slowdown: SlowdownModel,
        strict_model: str | None,
        *,
        extended: bool,
        reserve_floor_mb: float,
    ):
        super().__init__(dispatcher, gpus, containers)
        self.distributor, self.sd, self.strict_model = distributor, slowdown, strict_model
        self.extended, self.reserve_floor_mb = extended, reserve_floor_mb

    def _serve(self, node: Node) -> None:
        q: ClassQueue[Job] = node.queue  # type: ignore[assignment]
        now = self.env.now
        # the first entries of each class while they could fit in free memory, in the queue's serving
        # order (a backlog of thousands is not re-sorted at every event)
        free = sum(u.memory_mb - u.used_mb for u in node.units)
        strict: list[Queued[Job]] = []
        left = free
        while q.strict_count and left > 0:
            strict.append(q.pop_class(True))
            left -= strict[-1].item.mem_mb
        be: list[Queued[Job]] = []
        while q.best_effort_count and free > 0:
            be.append(q.pop_class(False))
            free -= be[-1].item.mem_mb
        overdue = [e for e in be if now - e.arrival > q.be_max_wait_s]
        entries = overdue + strict + be[len(overdue) :]
        idle = {m: self.containers.idle(node, m) for m in {e.item.model for e in entries}}
        ready: list[Queued[Job]] = []
        for e in entries:
            if idle[e.item.model] > 0:
                idle[e.item.model] -= 1
                ready.append(e)
            else:
                q.push_entry(e)
        if not ready:
            return
        by_id = {u.id: u for u in node.units}
        slices = [
            SliceState(
                u.id,
                u.profile,
                u.memory_mb,
                u.used_mb,
                tuple((j.model, j.strict) for j in u.jobs),
                True,
                sum(j.mem_mb for j in u.jobs if j.strict),
            )
            for u in node.units
        ]
        batches = [
            Batch(
                e.item.id,
                e.item.model,
                e.item.strict,
                e.item.mem_mb,
                None if e.deadline is None else e.deadline - now,
            )
            for e in ready
        ]
        be_mem = node.queued_be_mb + sum(s.used_mb - s.strict_mb for s in slices)  # `ready` is still counted
        reserve = 0.0
        if self.extended and self.strict_model:
            need = max(1, math.ceil(node.strict_pred), node.resident[True])
            reserve = max(need * self.sd.spec(self.strict_model).mem_mb, self.reserve_floor_mb)
        # no strict function deployed: Guideline 1 has no large slice to keep free (our extension)
        strict_expected = not self.extended or self.strict_model is not None
        dist = self.distributor.distribute(batches, slices, be_mem, node.be_model, reserve, strict_expected)
        placed = {p.batch.id: p.slice for p in dist.placements}
        for e in ready:
            uid = placed.get(e.item.id)
            if uid is None:
                q.push_entry(e)
            else:
                self._start(node, by_id[uid], e.item)
