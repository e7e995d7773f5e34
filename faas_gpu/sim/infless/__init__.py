"""INFless (ASPLOS '22) against OpenFaaS+ and BATCH (Table 3) on the paper's cluster, in simulation.

A fixed-step fluid model at 1 s steps, not simpy's per-request events: the evaluation needs the
cluster at its limit (tens of thousands of requests per second for the Q&A models) and hour-long
traces, i.e. 10^8 requests, while every policy here acts on *rates* once per control period
(Eq. 1, the dispatcher's three cases, uniform scaling). Within a step requests arrive evenly (a
load generator at a fixed RPS), so an instance with batch b, timeout T and execution time t meets
the SLO exactly when its rate stays under b / t and wait + t <= SLO, which the policies ensure by
construction. What the model counts as SLO violations is therefore what the paper names as their
cause: requests that find no warm capacity and wait a cold start (`cold_start_s`, an assumption:
the paper gives no figure), and load beyond the warm instances' capacity.

Systems (the paper's §5.1 and Table 3); every instance runs at its profiled latency (the truth),
and what a system predicts is its own business:
- INFless: each control period the dispatcher (`dispatch`, alpha = 0.8) sets per-instance rates and
  names the residual, Algorithm 1 (`schedule`) adds instances for it (after reviving idle ones),
  released instances stay idle for LSTH's keep-alive window (the "dynamic keep-alive" of Table 3),
  an idle function is pre-warmed as the provider does; built-in batching with the Eq. 1 timeouts;
  predicted latency = profile x 1.10 (§3.3's offset).
- OpenFaaS+: batch 1, every instance 2 CPU threads + 10% SM (the smallest profiled CPU share;
  the only one profiled at batch 1 for every model), uniform scaling: ceil(R / r_up) instances,
  fixed 300 s keep-alive (instances needed in the last 300 s stay).
- BATCH: OTP batching: one buffer per function fills batches at the function's whole rate R and
  times out at T = SLO - t; one (batch, CPU, GPU) for all instances, the one with the lowest
  cost per request (resources x execution time / requests per batch, pay-per-use as on Lambda)
  among the GPU configurations meeting the SLO at R (an OTP system cannot switch to the CPU, §1);
  a new choice is taken only when it is >= 10% cheaper; uniform scaling, fixed 300 s keep-alive.
- Ablations: INFless with batch sizes {1} (no BB), `select="max-throughput"` (no RS), predicted
  latency x 1.5 / x 2 (OP1.5 / OP2).
Resources are the slots of the authors' scheduler (socket j's 20 threads with GPU j) and are
weighed as the authors' code weighs them, 64 per thread and 142 per 1% SM (`beta` = 64/142), in
Algorithm 1, in BATCH's cost and in the throughput-per-resource metric alike.

Modules, one role each: `model` (functions, instances, the cluster's free resources, the
`Platform` and `System` seams), `simulation` (the 1 s loop and `make_system`), `infless_system`
(INFless and its ablations), `baselines` (OpenFaaS+ and BATCH), `metrics` (per-function counts and
the paper's metrics), `stress` (Fig. 11's stress test, the patterns' loads), `keepalive_replay`
(Fig. 16) and `schedule_cost` (Fig. 17).
"""

from .baselines import Batch, OpenFaaSPlus
from .infless_system import INFlessSystem
from .keepalive_replay import KeepAliveStats, replay_keepalive
from .metrics import FnStats, RunResult
from .model import (
    BETA,
    COLD_START_S,
    KEEPALIVE_S,
    MIN_AGE_S,
    OPENFAAS_CONFIG,
    SCENARIOS,
    Cluster,
    Function,
    Instance,
    Platform,
    System,
    scenario_functions,
)
from .schedule_cost import ScheduleCost, schedule_cost
from .simulation import SYSTEMS, Simulation, make_system, simulate
from .stress import StressPoint, max_sustained, pattern_loads

__all__ = [
    "BETA",
    "COLD_START_S",
    "KEEPALIVE_S",
    "MIN_AGE_S",
    "OPENFAAS_CONFIG",
    "SCENARIOS",
    "SYSTEMS",
    "Batch",
    "Cluster",
    "FnStats",
    "Function",
    "INFlessSystem",
    "Instance",
    "KeepAliveStats",
    "OpenFaaSPlus",
    "Platform",
    "RunResult",
    "ScheduleCost",
    "Simulation",
    "StressPoint",
    "System",
    "make_system",
    "max_sustained",
    "pattern_loads",
    "replay_keepalive",
    "scenario_functions",
    "schedule_cost",
    "simulate",
]
