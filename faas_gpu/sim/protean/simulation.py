"""One PROTEAN simulation run: the parts wired together and the simpy processes that drive them.

Arrivals go to the dispatcher (`dispatcher`), which queues each batch on a node; the node's
containers are scaled (`containers`) and the node serves its queue as its scheme says
(`serving`) on units whose speed is the ground truth (`gpu`); under PROTEAN the monitor
reconfigures MIG geometries (`reconfiguration`), and with a `SpotSetting` the nodes are bought
and lost on an emulated cloud (`procurement`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from faas_gpu.policies.protean import (
    BE_SHARE,
    Assumptions,
    ClassQueue,
    ProteanScaling,
    admission_queue,
    job_distributor,
)
from faas_gpu.policies.protean.reconfigurator import reconfigurator_from_assumptions
from faas_gpu.policy_data.protean import default_assumptions

from .containers import ContainerAutoscaler
from .dispatcher import Dispatcher
from .gpu import Gpus
from .model import Job, Node
from .procurement import SpotCluster, SpotSetting
from .reconfiguration import GeometryControl
from .result import RunResult
from .serving import ClassBlindServing, ProteanServing, Serving
from .workload import Workload, make_jobs

SCHEMES = ("molecule_beta", "infless_llama", "naive_slicing", "protean")
VARIANTS = ("protean_paper",)  # PROTEAN with the paper's Eq. 2 and Alg. 2 thresholds only


class ProteanSim:
    """One run of one scheme over one workload (see the package docstring)."""

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
        self.scheme, self.workload, self.n_nodes, self.seed = scheme, workload, nodes, seed
        self.a = assumptions or default_assumptions()
        self.sd = self.a.slowdown
        self.progress = progress
        self.horizon_s = horizon_s  # the run stops this long after the last arrival, finished or not
        rng = np.random.default_rng(seed)
        self.jobs = make_jobs(workload, self.a, rng)
        self.env = simpy.Environment()
        self.nodes: list[Node] = []
        self.done = 0
        self.arrivals_over = False
        setting = self.a.setting
        gpu = self.sd.gpu
        if scheme in ("molecule_beta", "infless_llama"):
            self.initial_geometry: tuple[str, ...] = (gpu.whole,)
        elif scheme == "naive_slicing":
            self.initial_geometry = gpu.validate(setting("simulator", "naive_geometry"))
        else:
            self.initial_geometry = gpu.validate(setting("simulator", "protean_initial_geometry"))

        env = self.env
        self.gpus = Gpus(
            env,
            self.sd,
            float(self.a.simulator["contention"]["corunner_overhead"]),
            exclusive=scheme == "molecule_beta",
            on_done=self._finish,
        )
        self.dispatcher = Dispatcher(env, self.nodes, class_aware=self.is_protean, on_queued=self._queued)
        self.containers = ContainerAutoscaler(env, self.sd, float(setting("simulator", "cold_start_s")), self._serve)
        self.serving: Serving
        if self.is_protean:
            distributor = job_distributor(self.a, extended=extended)
            self.serving = ProteanServing(
                self.dispatcher,
                self.gpus,
                self.containers,
                distributor,
                self.sd,
                workload.strict_model,
                extended=extended,
                reserve_floor_mb=float(setting("policy", "strict_reserve_floor_mb")),
            )
        else:
            self.serving = ClassBlindServing(scheme, self.dispatcher, self.gpus, self.containers)
        self.geometry = GeometryControl(
            env,
            self.nodes,
            reconfigurator_from_assumptions(self.a, strict_aware=extended),
            self.dispatcher,
            self.gpus,
            monitor_s=float(setting("policy", "monitor_interval_s")),
            reconfig_s=float(setting("policy", "reconfig_s")),
            strict_model=workload.strict_model,
            serve=self._serve,
            finished=self._finished,
        )
        self.spot: SpotCluster | None = None
        if spot is not None:
            self.spot = SpotCluster(
                env,
                spot,
                self.a,
                seed,
                nodes,
                self.nodes,
                self.dispatcher,
                self.gpus,
                add_node=self._add_node,
                serve=self._serve,
                finished=self._finished,
            )

    # -- the wiring between the parts -----------------------------------------------------------

    def _add_node(self, state: str = "ready") -> Node:
        """A node with the scheme's initial geometry, its queue, autoscaler and pre-warmed containers."""
        nid = len(self.nodes)
        queue: ClassQueue[Job] | deque[Job] = (
            admission_queue(float(self.a.setting("policy", "be_max_wait_s")), self._be_share())
            if self.is_protean
            else deque()
        )
        node = Node(
            nid,
            state,
            self.initial_geometry,
            self.gpus.make_units(nid, self.initial_geometry),
            queue,
            ProteanScaling(float(self.a.setting("policy", "surplus_window_s"))),
            since=self.env.now,
        )
        self.nodes.append(node)
        self.containers.prewarm(node, self.workload, self.n_nodes)
        return node

    def _be_share(self) -> float:
        """`policy.be_share` of the assumptions; a file that does not build on the package's may lack
        it: then the live scheduler's default."""
        return float(self.a.setting("policy", "be_share")) if "be_share" in self.a.policy else BE_SHARE

    def _serve(self, node: Node) -> None:
        self.serving.serve(node)

    def _queued(self, node: Node) -> None:
        """A batch joined `node`'s queue: scale its containers, and serve it if the node is up."""
        self.containers.autoscale(node)
        if node.state == "ready":
            self._serve(node)

    def _finish(self, j: Job) -> None:
        """Batch `j` ended on its unit: free its container, then the node drains or serves on."""
        node = self.nodes[j.node]
        node.running -= 1
        node.containers[j.model].busy -= 1
        self.dispatcher.resident(node, j.strict, -1)
        j.end = self.env.now
        self.done += 1
        if self.progress:
            self.progress(1)
        if node.state == "draining" and node.running == 0:
            self.geometry.reconfigure(node)
        elif node.state == "cordoned" and node.running == 0:
            pass
        else:
            self._serve(node)

    # -- the run ------------------------------------------------------------------------------

    def _finished(self) -> bool:
        return self.arrivals_over and self.done >= len(self.jobs)

    def _arrive(self):
        env = self.env
        for j in self.jobs:
            if j.arrival > env.now:
                yield env.timeout(j.arrival - env.now)
            self.dispatcher.dispatch(j)
        self.arrivals_over = True

    def _tick_autoscaler(self):
        while not self._finished():
            yield self.env.timeout(1.0)
            for n in self.nodes:
                if n.state in ("ready", "draining", "reconfiguring"):
                    self.containers.autoscale(n)

    def run(self) -> RunResult:
        env = self.env
        if self.spot is not None:
            self.spot.start()
        else:
            for _ in range(self.n_nodes):
                self._add_node()
        env.process(self._arrive())
        if self.is_protean:
            env.process(self.geometry.monitor())
        env.process(self._tick_autoscaler())
        env.run(until=self.workload.trace.duration_s + self.horizon_s)
        end = env.now
        for n in self.nodes:
            if n.state != "gone":
                self.geometry.account(n)
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
            self.geometry.reconfigurations,
            self.containers.cold_starts,
            end,
            self.spot.cost(end) if self.spot is not None else {},
            dict(self.geometry.geometry_time),
        )


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
