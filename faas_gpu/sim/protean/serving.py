"""How a node serves its queue, the one thing the schemes differ in (paper §5):

- `molecule_beta`: the whole GPU, time-shared: one batch at a time, in arrival order.
- `infless_llama`: the whole GPU shared through MPS by every batch that fits its memory.
- `naive_slicing`: a static (4g, 3g) geometry, MPS within each slice, each batch to the slice
  with the least memory load (used / size), whatever its class.
- `protean`: the live scheduler's admission (the class queue, strict EDF first, best-effort
  bounded by `be_max_wait_s` and `be_share`, `admit`) on each node's queue, then the live
  scheduler's placement across the nodes: one LALB-O3 (`make_scheduler`, the factory the
  scheduler's unit view calls) over every slice of every ready node, asking PROTEAN's Alg. 1
  object (`JobDistributionPreference`, one GPU per node) each round, with a strict reservation
  predicted by the monitor (`Node.strict_pred`).

A batch starts only where a warm container of its model is idle. Under PROTEAN the containers
are LALB-O3's model cache: a slice caches the models with an idle warm container on its node, so
a hit starts at once; a miss on another node moves the batch to that node's queue, whose
autoscaler starts a container (LALB's model load is the container's cold start).
"""

from __future__ import annotations

import math
from collections import deque

from faas_gpu.policies import Request
from faas_gpu.policies.lalb import LALBScheduler, Model, make_scheduler
from faas_gpu.policies.lalb import Unit as LalbUnit
from faas_gpu.policies.lalb_job_distribution import JobClass, JobDistributionPreference, MigSlice
from faas_gpu.policies.model_cache import ModelCache
from faas_gpu.policies.protean import ClassQueue, JobDistributor, Queued, SliceState, SlowdownModel, admit
from faas_gpu.policies.protean.distribution import reserve_for_strict

from .containers import ContainerAutoscaler
from .dispatcher import Dispatcher
from .gpu import Gpus
from .model import Job, Node, Unit

CACHE_MB = 1e12  # LALB's cache stands for the containers: memory is Alg. 1's to judge, not the cache's


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
        cold = containers.cold_start_s  # a miss: the container's cold start is LALB's model load
        self.models = {m: Model(m, slowdown.spec(m).mem_mb, cold, slowdown.spec(m).exec_7g_s) for m in slowdown.models}
        self.lalb: LALBScheduler | None = None
        self.lalb_key: tuple[int, ...] = ()
        self.lalb_units: list[Unit] = []

    def serve(self, node: Node) -> None:
        """Any event on a ready node starts a placement round over the whole cluster."""
        if node.state == "ready":
            self._round()

    def _ready_nodes(self) -> list[Node]:
        return [n for n in self.dispatcher.nodes if n.state == "ready"]

    def _lalb(self, nodes: list[Node]) -> LALBScheduler:
        """LALB-O3 over the slices of the ready nodes, from the scheduler's factory; rebuilt when
        the slices change (a reconfiguration, a node come or gone), as the unit view does."""
        units = [u for n in nodes for u in n.units]
        key = tuple(u.id for u in units)
        if self.lalb is None or key != self.lalb_key:
            self.lalb_key, self.lalb_units = key, units
            self.lalb = make_scheduler(
                "lalb_o3", [LalbUnit(i, ModelCache(CACHE_MB), node=u.node) for i, u in enumerate(units)], self.models
            )
        return self.lalb  # type: ignore[return-value]

    def _sync_cache(self, lalb: LALBScheduler) -> None:
        """A slice caches the models with an idle warm container on its node."""
        idle: dict[int, list[str]] = {}
        lalb.holders = {}
        for i, u in enumerate(self.lalb_units):
            if u.node not in idle:
                node = self.dispatcher.nodes[u.node]
                idle[u.node] = [m for m in node.containers if self.containers.idle(node, m) > 0]
            cache = lalb.units[i].cache = ModelCache(CACHE_MB)
            for m in idle[u.node]:
                if m in self.models:
                    cache.load(m, self.models[m].size_mb)
                    lalb.holders.setdefault(m, set()).add(i)

    def _round(self) -> None:
        """Admit on every ready node (the live scheduler's rule), then let LALB-O3 with Alg. 1 as its
        unit preference place the admitted batches across the nodes. The slices run several batches
        through MPS: a slice LALB dispatched to is idle again at once (its memory is Alg. 1's to
        judge), and LALB-O3 is asked again until it places nothing more."""
        now = self.env.now
        nodes = self._ready_nodes()
        entries: list[tuple[Node, Queued[Job]]] = []
        for n in nodes:
            if n.queue:
                entries.extend((n, e) for e in self._admit(n, n.queue, now))  # type: ignore[arg-type]
        if not entries:
            return
        lalb = self._lalb(nodes)
        self._sync_cache(lalb)
        entries.sort(key=lambda ne: (not ne[1].item.strict, ne[1].deadline if ne[1].item.strict else ne[1].arrival))
        origin = {e.item.id: (n, e) for n, e in entries}
        for _, e in entries:
            lalb.submit(Request(e.item.id, e.item.model, e.arrival), now)
        units = self.lalb_units
        while lalb.queue:
            preference = self._preference(nodes, origin, now)
            lalb.unit_preference = preference
            decisions = lalb.schedule(now)
            if not decisions:
                break
            for d in decisions:
                lalb.complete(d.unit, now)
                n, e = origin.pop(d.request.id)
                u, j = units[d.unit], e.item
                target = self.dispatcher.nodes[u.node]
                batch = preference.batch(d.request)
                ok = batch is not None and preference.choose(batch, [preference.slices[d.unit].state])
                if not ok:
                    n.queue.push_entry(e)  # type: ignore[union-attr]  # Alg. 1 holds it: back to its queue
                    continue
                if target is not n:
                    self._move(n, target, j)
                if self.containers.idle(target, j.model) > 0:
                    self._start(target, u, j)
                    if self.containers.idle(target, j.model) == 0:
                        self._sync_cache(lalb)
                else:  # a miss: the batch waits on that node for the container its autoscaler starts
                    target.queue.push_entry(e)  # type: ignore[union-attr]
                    self.containers.autoscale(target)
        for rid in list(origin):  # left queued (none expected: every slice is idle to LALB)
            if lalb.withdraw(rid) is not None:
                n, e = origin.pop(rid)
                n.queue.push_entry(e)  # type: ignore[union-attr]

    def _move(self, src: Node, dst: Node, j: Job) -> None:
        """Batch `j`, queued on `src`, now belongs to `dst` (its counts follow it)."""
        d = self.dispatcher
        d.enqueued(src, j, -1)
        d.resident(src, j.strict, -1)
        d.resident(dst, j.strict, +1)
        d.enqueued(dst, j, +1)

    def _preference(
        self, nodes: list[Node], origin: dict[int, tuple[Node, Queued[Job]]], now: float
    ) -> JobDistributionPreference:
        """Alg. 1's view of this round, as the live scheduler builds it: every slice of every ready
        node (one GPU each, with the strict reservation of our extension), the best-effort memory
        resident on each GPU, and the jobs LALB-O3 holds."""
        index = {u.id: i for i, u in enumerate(self.lalb_units)}
        slices: list[MigSlice] = []
        be_mem: dict[int, float] = {}
        be_model: dict[int, str] = {}
        for node in nodes:
            states = [
                SliceState(
                    index[u.id],
                    u.profile,
                    u.memory_mb,
                    u.used_mb,
                    tuple((j.model, j.strict) for j in u.jobs),
                    True,
                    sum(j.mem_mb for j in u.jobs if j.strict),
                )
                for u in node.units
            ]
            be_mem[node.id] = node.queued_be_mb + sum(s.used_mb - s.strict_mb for s in states)
            if node.be_model:
                be_model[node.id] = node.be_model
            if self.extended and self.strict_model:
                need = max(1, math.ceil(node.strict_pred), node.resident[True])
                reserve = max(need * self.sd.spec(self.strict_model).mem_mb, self.reserve_floor_mb)
                states = reserve_for_strict(states, reserve, self.sd)
            slices.extend(MigSlice(node.id, s) for s in states)
        jobs = {
            rid: JobClass(e.item.model, e.item.strict, None if e.deadline is None else e.deadline - now)
            for rid, (_, e) in origin.items()
        }
        # no strict function deployed: Guideline 1 has no large slice to keep free (our extension)
        strict_expected = not self.extended or self.strict_model is not None
        return JobDistributionPreference(
            self.distributor, slices, jobs, be_mem, be_model, strict_expected=strict_expected
        )

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
