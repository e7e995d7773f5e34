"""PROTEAN's experiments in the simulator: four ways to serve strict and best-effort batches on GPUs.

Schemes (paper §5), on `nodes` single-GPU workers (8 x A100-40GB):
- `molecule_beta`: the whole GPU, time-shared: one batch at a time, in arrival order.
- `infless_llama`: the whole GPU shared through MPS by every batch that fits its memory.
- `naive_slicing`: a static (4g, 3g) geometry, MPS within each slice, each batch to the slice
  with the least memory load (used / size), whatever its class.
- `protean`: the policies of `faas_gpu.policies.protean`: the classes queue (strict EDF first,
  bounded BE wait), Job Distribution (Alg. 1), the Reconfigurator (Alg. 2, draining and ~2 s of
  downtime per change, at most 30% of GPUs at once); optionally spot/on-demand procurement.
Every scheme gets the same dispatcher (the node where the fewest batches are ahead of this one in
that node's serving order: all of them where service is class-blind, only the strict ones for a
strict batch under PROTEAN, whose best-effort work waits behind strict work), the same batches,
and the same container autoscaler (`ProteanScaling`: one container per batch, delayed
termination, cold starts), so they differ only in how a node serves its batches.

How a GPU behaves (the ground truth, `assumptions.yaml` > simulator.contention): n batches that
share a unit through MPS progress at rate 1 / (RDF x max(1, sum d, sum FBR) x (1 + k (n - 1))),
re-rated whenever a batch starts or ends; a time-shared GPU runs one batch at rate 1. The
policies never see this formula: PROTEAN plans with Eq. 2 (or its SM-share extension) only.

Latency is a batch's, from its formation to its end (queueing + cold start + execution), as in
the paper (§4.1); every request of a batch has its batch's latency.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from faas_gpu.cloud import EmulatedCloud
from faas_gpu.policies.protean import (
    Assumptions,
    Batch,
    ClassQueue,
    CostMeter,
    FunctionLoad,
    GpuObservation,
    JobDistributor,
    NodeKind,
    NodeState,
    PriceSeries,
    Procurement,
    ProcurementSnapshot,
    ProteanScaling,
    Queued,
    ScaleSnapshot,
    SliceState,
)
from faas_gpu.policies.protean.reconfigurator import reconfigurator_from_assumptions
from faas_gpu.policy_data.protean import default_assumptions

from .protean_trace import RateTrace, batch_arrivals

SCHEMES = ("molecule_beta", "infless_llama", "naive_slicing", "protean")
VARIANTS = ("protean_paper",)  # PROTEAN with the paper's Eq. 2 and Alg. 2 thresholds only


@dataclass(frozen=True)
class Workload:
    """What arrives: a strict model (fixed) and best-effort models (one at a time, changing)."""

    trace: RateTrace
    strict_model: str | None
    be_models: tuple[str, ...]
    strict_share: float = 0.5
    be_switch_s: float | None = None  # None: assumptions.yaml's simulator.be_switch_s (the paper's ~20 s)


@dataclass(frozen=True)
class SpotSetting:
    """Run with spot/on-demand procurement (`mode` as `Procurement`) under revocation probability `p_rev`."""

    p_rev: float
    mode: str = "hybrid"
    spot_prices: PriceSeries | None = None
    on_demand_per_hour: float = 1.0


@dataclass
class Job:
    id: int
    model: str
    strict: bool
    arrival: float
    deadline: float | None
    mem_mb: float
    work: float  # execution time alone on 7g (s), this batch's draw
    remaining: float = 0.0
    rate: float = 0.0
    node: int = -1
    unit: int = -1
    start: float = math.nan
    end: float = math.nan
    profile: str = ""


@dataclass
class Unit:
    id: int
    node: int
    profile: str
    memory_mb: float
    exclusive: bool  # time-shared: one batch at a time
    jobs: list[Job] = field(default_factory=list)
    used_mb: float = 0.0
    last: float = 0.0
    wake: simpy.Event | None = None
    gone: bool = False


@dataclass
class Containers:
    warm: int = 0
    busy: int = 0
    starting: int = 0


@dataclass
class Node:
    id: int
    state: str  # ready | draining | reconfiguring | booting | cordoned | gone
    geometry: tuple[str, ...]
    units: list[Unit]
    queue: ClassQueue[Job] | deque[Job]
    scaler: ProteanScaling
    containers: dict[str, Containers] = field(default_factory=dict)
    running: int = 0
    last_assigned: float = -1.0
    be_model: str | None = None
    resident: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # by strict
    waiting: dict[str, int] = field(default_factory=dict)  # queued batches by model (kept, not counted)
    queued_be_mb: float = 0.0  # memory of the queued best-effort batches
    area: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    area_t: float = 0.0
    target: tuple[str, ...] | None = None
    strict_pred: float = 0.0  # EWMA of strict batches resident (PROTEAN's strict reservation)
    cloud_id: str | None = None
    kind: NodeKind = NodeKind.ON_DEMAND
    since: float = 0.0  # when the current geometry was set
    acquired_at: float = 0.0  # when the node was bought (cost)

    @property
    def outstanding(self) -> int:
        return self.running + len(self.queue)


@dataclass
class RunResult:
    scheme: str
    workload: str
    strict_latency_s: np.ndarray
    strict_slo_s: float
    be_latency_s: np.ndarray
    reconfigurations: int
    cold_starts: int
    makespan_s: float
    cost: dict[str, float] = field(default_factory=dict)
    geometry_time: dict[tuple[str, ...], float] = field(default_factory=dict)

    @property
    def strict_slo_pct(self) -> float:
        n = len(self.strict_latency_s)
        return 100.0 * float((self.strict_latency_s <= self.strict_slo_s + 1e-9).sum()) / n if n else math.nan

    def pct(self, values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) * 1000.0 if len(values) else math.nan

    def summary(self) -> dict[str, float | int | str]:
        return {
            "scheme": self.scheme,
            "workload": self.workload,
            "strict_batches": len(self.strict_latency_s),
            "strict_slo_pct": self.strict_slo_pct,
            "strict_p50_ms": self.pct(self.strict_latency_s, 50),
            "strict_p99_ms": self.pct(self.strict_latency_s, 99),
            "slo_ms": self.strict_slo_s * 1000.0,
            "be_batches": len(self.be_latency_s),
            "be_p50_ms": self.pct(self.be_latency_s, 50),
            "be_p99_ms": self.pct(self.be_latency_s, 99),
            "reconfigurations": self.reconfigurations,
            "cold_starts": self.cold_starts,
            **{f"cost_{k}": v for k, v in self.cost.items()},
        }


def make_jobs(workload: Workload, a: Assumptions, rng: np.random.Generator) -> list[Job]:
    """Every batch of the run, in arrival order, with its model, class, deadline and execution draw."""
    models = a.models
    cv = float(a.setting("simulator", "exec_cv"))
    sigma = math.sqrt(math.log(1 + cv * cv))
    out: list[tuple[float, str, bool]] = []
    if workload.strict_model and workload.strict_share > 0:
        b = models[workload.strict_model].batch
        out += [(t, workload.strict_model, True) for t in batch_arrivals(workload.trace, workload.strict_share, b, rng)]
    if workload.be_models and workload.strict_share < 1:
        switch_s = workload.be_switch_s or float(a.setting("simulator", "be_switch_s"))
        periods = int(workload.trace.duration_s // switch_s) + 1
        choice = [workload.be_models[int(i)] for i in rng.integers(0, len(workload.be_models), size=periods)]
        b = models[workload.be_models[0]].batch  # BE models of a workload share the domain's batch size
        for t in batch_arrivals(workload.trace, 1 - workload.strict_share, b, rng):
            out.append((t, choice[int(t // switch_s)], False))
    out.sort(key=lambda x: x[0])
    noise = rng.lognormal(-sigma * sigma / 2, sigma, size=len(out))
    jobs = []
    for i, ((t, m, strict), z) in enumerate(zip(out, noise, strict=True)):
        spec = models[m]
        deadline = t + a.slo_factor * spec.exec_7g_s if strict else None
        jobs.append(Job(i, m, strict, float(t), deadline, spec.mem_mb, spec.exec_7g_s * float(z)))
    return jobs


class ProteanSim:
    """One run of one scheme over one workload (see the module docstring)."""

    def __init__(
        self,
        scheme: str,
        workload: Workload,
        *,
        nodes: int = 8,
        seed: int = 1,
        assumptions: Assumptions | None = None,
        spot: SpotSetting | None = None,
        progress: Callable[[int], None] | None = None,
        horizon_s: float = 600.0,
    ):
        if scheme not in SCHEMES + VARIANTS:
            raise ValueError(f"scheme: expected one of {', '.join(SCHEMES + VARIANTS)}, got {scheme!r}")
        self.is_protean = scheme.startswith("protean")
        extended = scheme == "protean"  # our extensions; protean_paper runs without them
        self.extended = extended
        self.scheme, self.workload, self.n_nodes, self.seed = scheme, workload, nodes, seed
        self.a = assumptions or default_assumptions()
        self.sd = self.a.slowdown
        self.gpu = self.sd.gpu
        self.spot = spot
        self.progress = progress
        self.horizon_s = horizon_s  # the run stops this long after the last arrival, finished or not
        rng = np.random.default_rng(seed)
        self.jobs = make_jobs(workload, self.a, rng)
        self.env = simpy.Environment()
        self.nodes: list[Node] = []
        self.units: list[Unit] = []
        self.done = 0
        self.pending: deque[Job] = deque()  # batches with no node to go to
        self.arrivals_over = False
        self.reconfigurations = 0
        self.cold_starts = 0
        self.geometry_time: dict[tuple[str, ...], float] = {}
        setting = self.a.setting
        self.cold_start_s = float(setting("simulator", "cold_start_s"))
        self.corunner_overhead = float(self.a.simulator["contention"]["corunner_overhead"])
        self.reserve_floor_mb = float(setting("policy", "strict_reserve_floor_mb"))
        self.monitor_s = float(setting("policy", "monitor_interval_s"))
        self.distributor = JobDistributor(
            self.sd,
            be_spill=not extended,
            sm_share=extended,
            deadline_aware=extended,
            protect_strict_eta=float(setting("policy", "strict_eta_limit")) if extended else None,
        )
        self.reconfigurator = reconfigurator_from_assumptions(self.a, strict_aware=extended)
        if scheme in ("molecule_beta", "infless_llama"):
            self.initial_geometry: tuple[str, ...] = (self.gpu.whole,)
        elif scheme == "naive_slicing":
            self.initial_geometry = self.gpu.validate(setting("simulator", "naive_geometry"))
        else:
            self.initial_geometry = self.gpu.validate(setting("simulator", "protean_initial_geometry"))
        self.cloud: EmulatedCloud | None = None
        self.procurement: Procurement | None = None
        self.costs: list[tuple[NodeKind, float, float]] = []

    # -- nodes and units ----------------------------------------------------------------------

    def _make_units(self, node_id: int, geometry: tuple[str, ...]) -> list[Unit]:
        units = []
        for key in geometry:
            u = Unit(len(self.units), node_id, key, float(self.gpu.memory_mb(key)), self.scheme == "molecule_beta")
            u.last = self.env.now
            self.units.append(u)
            units.append(u)
            self.env.process(self._unit_loop(u))
        return units

    def _new_node(self, state: str = "ready") -> Node:
        nid = len(self.nodes)
        queue: ClassQueue[Job] | deque[Job] = (
            ClassQueue(float(self.a.setting("policy", "be_max_wait_s"))) if self.is_protean else deque()
        )
        node = Node(
            nid,
            state,
            self.initial_geometry,
            self._make_units(nid, self.initial_geometry),
            queue,
            ProteanScaling(float(self.a.setting("policy", "surplus_window_s"))),
            since=self.env.now,
        )
        self.nodes.append(node)
        return node

    def _prewarm(self, node: Node) -> None:
        """Containers as the expected load per node asks for (the cluster has run before t = 0)."""
        w = self.workload
        rate = w.trace.rates[0] if len(w.trace.rates) else 0.0
        models = ([w.strict_model] if w.strict_model else []) + list(w.be_models)
        for m in dict.fromkeys(models):
            spec = self.sd.spec(m)
            share = w.strict_share if m == w.strict_model else (1 - w.strict_share) / max(1, len(w.be_models))
            per_node = rate * share / spec.batch / self.n_nodes * spec.exec_7g_s
            node.containers.setdefault(m, Containers()).warm = math.ceil(2 * per_node) + 1

    # -- the GPU ------------------------------------------------------------------------------

    def _advance(self, u: Unit) -> None:
        dt = self.env.now - u.last
        if dt > 0:
            for j in u.jobs:
                j.remaining -= j.rate * dt
        u.last = self.env.now

    def _rerate(self, u: Unit) -> None:
        if not u.jobs:
            return
        if u.exclusive:
            for j in u.jobs:
                j.rate = 1.0 / self.sd.rdf(j.model, u.profile)
            return
        sum_d = sum(self.sd.compute_demand(j.model, u.profile) for j in u.jobs)
        sum_f = sum(self.sd.fbr(j.model) for j in u.jobs)
        contention = max(1.0, sum_d, sum_f) * (1.0 + self.corunner_overhead * (len(u.jobs) - 1))
        for j in u.jobs:
            j.rate = 1.0 / (self.sd.rdf(j.model, u.profile) * contention)

    def _poke(self, u: Unit) -> None:
        if u.wake is not None and not u.wake.triggered:
            u.wake.succeed()

    def _unit_loop(self, u: Unit):
        env = self.env
        while True:
            if u.gone:
                return
            u.wake = env.event()
            if not u.jobs:
                yield u.wake
                continue
            dt = max(0.0, min(j.remaining / j.rate for j in u.jobs))
            yield env.timeout(dt) | u.wake
            self._advance(u)
            finished = [j for j in u.jobs if j.remaining <= 1e-9]
            if finished:
                u.jobs = [j for j in u.jobs if j.remaining > 1e-9]
                for j in finished:
                    u.used_mb -= j.mem_mb
                self._rerate(u)
                for j in finished:
                    self._finish(j)

    def _start(self, node: Node, u: Unit, j: Job) -> None:
        """Run `j`, taken off `node`'s queue, on unit `u`."""
        self._enqueued(node, j, -1)
        self._advance(u)
        j.remaining, j.node, j.unit, j.start, j.profile = j.work, node.id, u.id, self.env.now, u.profile
        u.jobs.append(j)
        u.used_mb += j.mem_mb
        node.running += 1
        node.containers[j.model].busy += 1
        self._rerate(u)
        self._poke(u)

    def _finish(self, j: Job) -> None:
        node = self.nodes[j.node]
        node.running -= 1
        node.containers[j.model].busy -= 1
        self._resident(node, j.strict, -1)
        j.end = self.env.now
        self.done += 1
        if self.progress:
            self.progress(1)
        if node.state == "draining" and node.running == 0:
            self.env.process(self._reconfigure(node))
        elif node.state == "cordoned" and node.running == 0:
            pass
        else:
            self._schedule(node)

    # -- containers ---------------------------------------------------------------------------

    def _autoscale(self, node: Node) -> None:
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
            self.env.process(self._container_start(node, m, n))
        for m, n in decision.terminate.items():
            c = node.containers[m]
            c.warm -= min(n, c.warm - c.busy)

    def _container_start(self, node: Node, model: str, n: int):
        yield self.env.timeout(self.cold_start_s)
        c = node.containers[model]
        c.starting -= n
        c.warm += n
        if node.state == "ready":
            self._schedule(node)

    def _idle_containers(self, node: Node, model: str) -> int:
        c = node.containers.get(model)
        return c.warm - c.busy if c else 0

    # -- queues and placement -----------------------------------------------------------------

    def _queued(self, node: Node) -> list[Job]:
        if isinstance(node.queue, ClassQueue):
            return [e.item for e in node.queue.entries()]
        return list(node.queue)

    def _resident(self, node: Node, strict: bool, delta: int) -> None:
        """Batches queued or running on the node, by class, integrated over time for the monitor."""
        now = self.env.now
        for c in (True, False):
            node.area[c] += node.resident[c] * (now - node.area_t)
        node.area_t = now
        node.resident[strict] += delta

    def _dispatch(self, j: Job) -> None:
        ready = [n for n in self.nodes if n.state == "ready"]
        if not ready:  # nothing serves: wait on the least-loaded node that will come back
            ready = [n for n in self.nodes if n.state in ("draining", "reconfiguring", "booting")]
        if not ready:  # no node at all (every spot node evicted): wait for one at the cluster
            self.pending.append(j)
            return
        node = min(ready, key=lambda n: (self._ahead(n, j), n.outstanding, n.last_assigned, n.id))
        node.last_assigned = self.env.now
        if not j.strict:
            node.be_model = j.model
        self._resident(node, j.strict, +1)
        if isinstance(node.queue, ClassQueue):
            node.queue.push(j, j.arrival, j.deadline)
        else:
            node.queue.append(j)
        self._enqueued(node, j, +1)
        self._autoscale(node)
        if node.state == "ready":
            self._schedule(node)

    def _ahead(self, node: Node, j: Job) -> int:
        """Batches that delay `j` on `node`: all of them where service is class-blind; for PROTEAN's
        strict batches, only the strict ones (best-effort work waits behind them, on other slices)."""
        if self.is_protean and j.strict:
            return node.resident[True]
        return node.outstanding

    def _withdraw(self, node: Node) -> list[Job]:
        """Take every queued job off `node` (to dispatch elsewhere)."""
        jobs = self._queued(node)
        if isinstance(node.queue, ClassQueue):
            node.queue = ClassQueue(node.queue.be_max_wait_s)
        else:
            node.queue.clear()
        for j in jobs:
            self._resident(node, j.strict, -1)
        node.waiting, node.queued_be_mb = {}, 0.0
        return jobs

    def _enqueued(self, node: Node, j: Job, delta: int) -> None:
        """Keep the node's queued counts (the autoscaler and Alg. 1 read them at every event)."""
        node.waiting[j.model] = node.waiting.get(j.model, 0) + delta
        if not j.strict:
            node.queued_be_mb += delta * j.mem_mb

    def _schedule(self, node: Node) -> None:
        if node.state != "ready" or not node.queue:
            return
        if self.is_protean:
            self._schedule_protean(node)
            return
        q: deque[Job] = node.queue  # type: ignore[assignment]
        keep: deque[Job] = deque()
        while q:
            j = q.popleft()
            u = self._choose_unit(node, j) if self._idle_containers(node, j.model) > 0 else None
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

    def _schedule_protean(self, node: Node) -> None:
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
        idle = {m: self._idle_containers(node, m) for m in {e.item.model for e in entries}}
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
        if self.extended and self.workload.strict_model:
            need = max(1, math.ceil(node.strict_pred), node.resident[True])
            reserve = max(need * self.sd.spec(self.workload.strict_model).mem_mb, self.reserve_floor_mb)
        # no strict function deployed: Guideline 1 has no large slice to keep free (our extension)
        strict_expected = not self.extended or self.workload.strict_model is not None
        dist = self.distributor.distribute(batches, slices, be_mem, node.be_model, reserve, strict_expected)
        placed = {p.batch.id: p.slice for p in dist.placements}
        for e in ready:
            uid = placed.get(e.item.id)
            if uid is None:
                q.push_entry(e)
            else:
                self._start(node, by_id[uid], e.item)

    # -- PROTEAN's reconfiguration ------------------------------------------------------------

    def _monitor(self):
        env = self.env
        while not self._finished():
            yield env.timeout(self.monitor_s)
            live = [n for n in self.nodes if n.state in ("ready", "draining", "reconfiguring")]
            obs = []
            for n in live:
                self._resident(n, False, 0)
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
                        self.workload.strict_model,
                    )
                )
            for n in live:  # the strict reservation may have shrunk: what waited for it may start now
                self._schedule(n)
            decision = self.reconfigurator.observe(obs, env.now)
            for r in decision.reconfigure:
                node = self.nodes[r.gpu]
                node.state, node.target = "draining", r.target
                self.reconfigurations += 1
                for j in self._withdraw(node):
                    self._dispatch(j)
                if node.running == 0:
                    env.process(self._reconfigure(node))

    def _reconfigure(self, node: Node):
        node.state = "reconfiguring"
        yield self.env.timeout(float(self.a.setting("policy", "reconfig_s")))
        if node.state != "reconfiguring":
            return
        for u in node.units:
            u.gone = True
            self._poke(u)
        self._account_geometry(node)
        node.geometry = node.target or node.geometry
        node.units = self._make_units(node.id, node.geometry)
        node.state = "ready"
        self._schedule(node)

    def _account_geometry(self, node: Node) -> None:
        g = tuple(node.geometry)
        self.geometry_time[g] = self.geometry_time.get(g, 0.0) + self.env.now - node.since
        node.since = self.env.now

    # -- spot procurement ---------------------------------------------------------------------

    def _procure(self):
        env, cloud, policy = self.env, self.cloud, self.procurement
        assert cloud is not None and policy is not None
        failed: list[NodeKind] = []
        while not self._finished():
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
                    for j in self._withdraw(node):
                        self._dispatch(j)
            for kind in decision.acquire:
                got = cloud.acquire(kind, now)
                if got is None:
                    failed.append(kind)
                    continue
                node = self._new_node("booting")
                node.cloud_id, node.kind, node.acquired_at = got.id, got.kind, now
                self._prewarm(node)
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
            while self.pending:
                self._dispatch(self.pending.popleft())
            self._schedule(node)

    def _by_cloud(self, cid: str) -> Node | None:
        return next((n for n in self.nodes if n.cloud_id == cid and n.state != "gone"), None)

    def _retire(self, node: Node, now: float) -> None:
        """The node is gone (released or evicted): charge it; batches still on it run again elsewhere."""
        self.costs.append((node.kind, node.acquired_at, now))
        node.state = "gone"
        lost = [j for u in node.units for j in u.jobs]
        for u in node.units:
            u.jobs, u.used_mb = [], 0.0
            u.gone = True
            self._poke(u)
        node.running = 0
        for j in self._withdraw(node) + lost:
            self._dispatch(j)

    # -- the run ------------------------------------------------------------------------------

    def _finished(self) -> bool:
        return self.arrivals_over and self.done >= len(self.jobs)

    def _arrive(self):
        env = self.env
        for j in self.jobs:
            if j.arrival > env.now:
                yield env.timeout(j.arrival - env.now)
            self._dispatch(j)
        self.arrivals_over = True

    def run(self) -> RunResult:
        env = self.env
        if self.spot is not None:
            s = self.spot
            lo, hi = self.a.setting("simulator", "notice_s")
            self.cloud = EmulatedCloud(
                self.seed,
                s.p_rev,
                eviction_interval_s=float(self.a.setting("simulator", "eviction_interval_s")),
                notice_s=(float(lo), float(hi)),
                boot_s=float(self.a.setting("simulator", "vm_boot_s")),
                spot_prices=s.spot_prices,
                on_demand_per_hour=s.on_demand_per_hour,
            )
            self.procurement = Procurement(self.n_nodes, s.mode)
            boot = self.cloud.boot_s
            for _ in range(self.n_nodes):  # the cluster as it stands at t = 0
                kind = NodeKind.ON_DEMAND if s.mode == "on-demand" else NodeKind.SPOT
                got = self.cloud.acquire(kind, -boot)
                if got is None and s.mode == "hybrid":
                    got = self.cloud.acquire(NodeKind.ON_DEMAND, -boot)
                if got is None:
                    continue
                node = self._new_node()
                node.cloud_id, node.kind, node.acquired_at = got.id, got.kind, 0.0
                self._prewarm(node)
            env.process(self._procure())
        else:
            for _ in range(self.n_nodes):
                self._prewarm(self._new_node())
        env.process(self._arrive())
        if self.is_protean:
            env.process(self._monitor())
        env.process(self._tick_autoscaler())
        env.run(until=self.workload.trace.duration_s + self.horizon_s)
        end = env.now
        for n in self.nodes:
            if n.state != "gone":
                self._account_geometry(n)
                if self.spot is not None:
                    self.costs.append((n.kind, n.acquired_at, end))
        # a batch still unfinished at the horizon counts as infinitely late
        strict = np.array([j.end - j.arrival if j.end == j.end else math.inf for j in self.jobs if j.strict])
        be = np.array([j.end - j.arrival if j.end == j.end else math.inf for j in self.jobs if not j.strict])
        slo = (
            self.a.slo_factor * self.sd.spec(self.workload.strict_model).exec_7g_s if self.workload.strict_model else 0
        )
        return RunResult(
            self.scheme,
            self.workload.trace.name,
            strict,
            slo,
            be,
            self.reconfigurations,
            self.cold_starts,
            end,
            self._cost(end),
            dict(self.geometry_time),
        )

    def _tick_autoscaler(self):
        while not self._finished():
            yield self.env.timeout(1.0)
            for n in self.nodes:
                if n.state in ("ready", "draining", "reconfiguring"):
                    self._autoscale(n)

    def _cost(self, end: float) -> dict[str, float]:
        if self.spot is None or self.cloud is None:
            return {}
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


def simulate(
    scheme: str,
    workload: Workload,
    *,
    nodes: int = 8,
    seed: int = 1,
    assumptions: Assumptions | None = None,
    spot: SpotSetting | None = None,
) -> RunResult:
    """Run `scheme` over `workload` on `nodes` GPUs; see `ProteanSim`."""
    return ProteanSim(scheme, workload, nodes=nodes, seed=seed, assumptions=assumptions, spot=spot).run()
