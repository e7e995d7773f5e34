"""How a node serves its queue, the one thing the schemes differ in (paper §5):

- `molecule_beta`: the whole GPU, time-shared: one batch at a time, in arrival order.
- `infless_llama`: the whole GPU shared through MPS by every batch that fits its memory.
- `naive_slicing`: a static (4g, 3g) geometry, MPS within each slice, each batch to the slice
  with the least memory load (used / size), whatever its class.
- `protean`: the live scheduler's admission (the class queue, strict EDF first, best-effort
  bounded by `be_max_wait_s` and `be_share`, `admit`) and its Alg. 1 object
  (`JobDistributionPreference`, as LALB-O3 asks it), with a strict reservation predicted by the
  monitor (`Node.strict_pred`).

A batch starts only where a warm container of its model is idle.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

from faas_gpu.policies.lalb_job_distribution import JobDistributionPreference, MigSlice
from faas_gpu.policies.protean import Batch, ClassQueue, JobDistributor, Queued, SliceState, SlowdownModel, admit
from faas_gpu.policies.protean.distribution import reserve_for_strict

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
        """Admit (the live scheduler's rule), then place what has a warm container (Alg. 1)."""
        q: ClassQueue[Job] = node.queue  # type: ignore[assignment]
        now = self.env.now
        admitted = self._admit(node, q, now)
        ready = self._ready(node, admitted)
        placed = self._place(node, ready, now) if ready else {}
        by_id = {u.id: u for u in node.units}
        for e in admitted:
            uid = placed.get(e.item.id)
            if uid is None:
                q.push_entry(e)  # back to the class queue, with its arrival and deadline
            else:
                self._start(node, by_id[uid], e.item)

    def _admit(self, node: Node, q: ClassQueue[Job], now: float) -> list[Queued[Job]]:
        """This round's admitted batches: the live scheduler's admission (`admit`, the class
        queue's serving order with `be_max_wait_s` and `be_share`) under its look-ahead, one batch
        per unit or, past that, as much as the node's free memory.

        The daemon's admitted jobs stay with the placement policy until a unit takes them (LALB
        starts every one as soon as a unit is idle). Here a batch may find no warm container, or
        Alg. 1 may hold it for room on a slice that suits it: it goes back to the class queue at
        the end of the round, so the next round sees the queue's order again rather than a
        window full of batches that cannot start (its pop still counted against `be_share`).
        """
        free = sum(u.memory_mb - u.used_mb for u in node.units)
        units = len(node.units)
        admitted: list[Queued[Job]] = []
        window = [0.0]
        for e in admit(q, now, lambda: len(admitted) < units or window[0] < free):
            admitted.append(e)
            window[0] += e.item.mem_mb
        return admitted

    def _ready(self, node: Node, admitted: list[Queued[Job]]) -> list[Queued[Job]]:
        """The admitted batches, in admission order, that find an idle warm container of their model."""
        idle = {m: self.containers.idle(node, m) for m in {e.item.model for e in admitted}}
        ready: list[Queued[Job]] = []
        for e in admitted:
            if idle[e.item.model] > 0:
                idle[e.item.model] -= 1
                ready.append(e)
        return ready

    def _place(self, node: Node, ready: list[Queued[Job]], now: float) -> dict[int, Hashable]:
        """Alg. 1 over the node's slices, asked through the live scheduler's object
        (`JobDistributionPreference`, the one LALB-O3 asks in the daemon): batch id -> slice id."""
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
        be_mem = node.queued_be_mb + sum(s.used_mb - s.strict_mb for s in slices)  # `ready` is still counted
        if self.extended and self.strict_model:
            need = max(1, math.ceil(node.strict_pred), node.resident[True])
            reserve = max(need * self.sd.spec(self.strict_model).mem_mb, self.reserve_floor_mb)
            slices = reserve_for_strict(slices, reserve, self.sd)
        # no strict function deployed: Guideline 1 has no large slice to keep free (our extension)
        strict_expected = not self.extended or self.strict_model is not None
        preference = JobDistributionPreference(
            self.distributor,
            [MigSlice(node.id, s) for s in slices],  # one GPU per node
            {},
            {node.id: be_mem},
            {node.id: node.be_model} if node.be_model else None,
            strict_expected=strict_expected,
        )
        state = {s.id: s for s in slices}
        placed: dict[int, Hashable] = {}
        for e in ready:
            j = e.item
            batch = Batch(j.id, j.model, j.strict, j.mem_mb, None if e.deadline is None else e.deadline - now)
            chosen = preference.choose(batch, list(state.values()))
            if chosen:
                s = chosen[0]
                placed[j.id] = s.id
                state[s.id] = s.with_batch(j.model, j.strict, j.mem_mb)
        return placed
