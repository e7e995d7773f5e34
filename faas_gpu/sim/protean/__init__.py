"""PROTEAN's experiments in the simulator: four ways to serve strict and best-effort batches on GPUs.

Schemes (paper §5), on `nodes` single-GPU workers (8 x A100-40GB):
- `molecule_beta`: the whole GPU, time-shared: one batch at a time, in arrival order.
- `infless_llama`: the whole GPU shared through MPS by every batch that fits its memory.
- `naive_slicing`: a static (4g, 3g) geometry, MPS within each slice, each batch to the slice
  with the least memory load (used / size), whatever its class.
- `protean`: the policies of `faas_gpu.policies.protean`: the classes queue (strict EDF first,
  bounded BE wait), then the live scheduler's placement across the nodes: LALB-O3 (built by
  `make_scheduler`, as the scheduler builds it) with Job Distribution (Alg. 1) as its unit
  preference, the Reconfigurator (Alg. 2, draining and ~2 s of
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

Modules, one role each: `workload` (what arrives, every batch drawn), `model` (batches, units,
containers, nodes), `gpu` (the ground truth above), `dispatcher` (which node gets a batch, the
queues' counts), `containers` (the autoscaler and cold starts), `serving` (how a node serves its
queue, per scheme), `reconfiguration` (PROTEAN's monitor and Alg. 2), `procurement` (spot and
on-demand nodes, cost), `result` (what a run reports) and `simulation` (the wiring and the run).
"""

from .containers import ContainerAutoscaler
from .dispatcher import Dispatcher
from .gpu import Gpus
from .model import Containers, Job, Node, Unit
from .procurement import SpotCluster, SpotSetting
from .reconfiguration import GeometryControl
from .result import RunResult
from .serving import ClassBlindServing, ProteanServing, Serving
from .simulation import SCHEMES, VARIANTS, ProteanSim, simulate
from .workload import Workload, make_jobs

__all__ = [
    "SCHEMES",
    "VARIANTS",
    "ClassBlindServing",
    "ContainerAutoscaler",
    "Containers",
    "Dispatcher",
    "GeometryControl",
    "Gpus",
    "Job",
    "Node",
    "ProteanServing",
    "ProteanSim",
    "RunResult",
    "Serving",
    "SpotCluster",
    "SpotSetting",
    "Unit",
    "Workload",
    "make_jobs",
    "simulate",
]
