"""HarmonyBatch: multi-SLO DNN inference batched on CPU or GPU serverless functions (issue 7).

Pure policies, from the paper (seeds/003, §III-IV):
- `models`: CPU latency (Eq. 1) and GPU latency under time slicing (Eq. 2-4);
- `cost`: prices and the per-request cost (Eq. 6), the equivalent batching timeout (Eq. 5);
- `platform`: the search ranges and the shapes of the platform's functions;
- `provision`: funcProvision with the binary searches of Theorems 1-2, the knee rate r*;
- `planner`: the two-stage merging of Alg. 1 and `plan()`, the entry point for all strategies;
- `baselines`: BATCH and MBS+ as the paper describes them;
- `fitter`: Eq. 1-2 coefficients from profiling runs (the runs themselves: `faas_gpu.profiling.harmony_runs`);
- `pools`: the live pools (rate window, re-plan rule, pools and copies), `app_pools` builds them
  for the provider and the simulator alike;
- `options`: the choices the paper leaves open, shared by the planner and the baselines.
The files (`model.json`, `config.json`) are read by `faas_gpu.policy_data.harmony`, which hands
the parsed data in. The simulator that replays app traces against plans is `faas_gpu.sim.harmony`.
"""

from .cost import ALIBABA_FC_CNY, PAPER_PRICES, Prices, equivalent_timeout, expected_batch
from .models import CpuCoefficients, ExpCurve, GpuCoefficients, ModelCoefficients
from .options import Options
from .planner import STRATEGIES, harmony, plan, provisioner
from .plans import App, Group, Plan
from .platform import Platform
from .pools import AppPools, Pool, app_pools
from .provision import InfeasibleSLOError, Load, Provision, Provisioner

__all__ = [
    "AppPools",
    "Pool",
    "app_pools",
    "ALIBABA_FC_CNY",
    "PAPER_PRICES",
    "STRATEGIES",
    "App",
    "CpuCoefficients",
    "ExpCurve",
    "GpuCoefficients",
    "Group",
    "InfeasibleSLOError",
    "Load",
    "ModelCoefficients",
    "Options",
    "Plan",
    "Platform",
    "Prices",
    "Provision",
    "Provisioner",
    "equivalent_timeout",
    "expected_batch",
    "harmony",
    "plan",
    "provisioner",
]
