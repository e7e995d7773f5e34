"""Every metric the daemons export on `/metrics`: its name, type, HELP text and label names.

Why in the contract: a metric's name and labels are what dashboards, alerts and the operator's
queries are written against — protocol between a daemon and everything that scrapes it, as much
as a header is. Written once here, the daemons build their `prometheus_client` objects from these
specs (`faas_gpu.observability`), the README's table is generated from them, and a test holds the
daemons' exports and this table to each other (every name here is exported by its daemon, and no
`faas_gpu_*` or `nv_*` name is exported that is not here).

Naming follows what users already query:
- OpenFaaS's `gateway_*` and `provider_*` names stay in `provider.metrics`, as OpenFaaS has them;
- GPU and inference metrics take Triton's names and labels where Triton has one (`nv_gpu_*` per
  GPU with `gpu_uuid`; `nv_inference_*` per model with `model` and `version`). Triton exposes its
  counters without the `_total` suffix, so those are written under their exact names, untyped
  (`Kind.EXACT_COUNTER`), as the gateway does with `gateway_function_invocation_started`;
- the rest is ours, `faas_gpu_*`, with Prometheus's conventions (`_total` counters, `_seconds`,
  `_bytes`).

Labels stay bounded: units, GPUs, functions (`name.namespace`; `cluster` for the daemons'
own jobs), apps, models (by digest), request classes and fixed outcome words; never a request or
job id. Plain data only: this module imports nothing of ours and no metrics library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    COUNTER = "counter"  # exposed as <name> ending in _total
    EXACT_COUNTER = "untyped"  # a counter under its exact name, no _total (Triton's names)
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Daemon(enum.Enum):
    SCHEDULER = "scheduler"
    GPU_MANAGER = "gpu_manager"
    PROCURER = "procurer"


# -- label names ---------------------------------------------------------------------------------
GPU_UUID = "gpu_uuid"
"""Triton's label of a GPU metric: the unit's NVML UUID (GPU-… or MIG-…), cpu-<n> for an emulated unit."""
UNIT = "unit"
"""A GPU Manager's unit id (the same value as `gpu_uuid`), on faas-gpu's own per-unit metrics."""
MODEL = "model"
"""Triton's model label: the model's name as its function declares it (`X-Faas-Gpu-Model`, the
first name seen for the digest), else the digest's first 12 hex digits."""
VERSION = "version"
"""Triton's version label: the model's digest, first 12 hex digits (a new upload is a new version)."""
FUNCTION = "function"
"""`name.namespace` of the function that sent a job; `cluster` for jobs sent with the cluster token."""
APP = "app"
"""HarmonyBatch's application of a job (`X-Faas-Gpu-App`); empty when the job names none."""
CLASS = "class"
"""PROTEAN's request class: `strict` or `best-effort`."""
SLO = "slo"
"""`within` or `over` its SLO."""
POLICY = "policy"
"""The placement policy: `lb`, `lalb` or `lalb_o3`."""
CACHE = "cache"
"""`hit` or `miss`: whether the placed unit held the model."""
GPU = "gpu"
"""A GPU's index on its node."""
RESULT = "result"
"""A MIG reconfiguration's end: `done`, `refused` (nothing touched) or `failed` (NVML failed mid-way)."""
KIND = "kind"
"""A unit's kind (`gpu`, `mig`, `cpu`), or a procured node's (`spot`, `on-demand`)."""
PROFILE = "profile"
"""A MIG unit's profile (`3g.20gb`); empty for a whole GPU or an emulated unit."""
STATE = "state"
"""A procured node's state: `booting`, `ready` or `cordoned`."""
EVENT = "event"
"""A procurement event: `acquired`, `failed`, `notice`, `evicted`, `released`."""

CLASSES = ("strict", "best-effort")
SLO_OUTCOMES = ("within", "over")
RECONFIGURATION_RESULTS = ("done", "refused", "failed")
CLUSTER_FUNCTION = "cluster"

BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PLACEMENT_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exposed and queried (a COUNTER's ends in _total)
    kind: Kind
    help: str
    labels: tuple[str, ...]
    daemon: Daemon
    collected: bool = False  # read at scrape time from the daemon's state, not incremented as events happen
    buckets: tuple[float, ...] = ()


SPECS: list[MetricSpec] = []


def _spec(name: str, kind: Kind, help: str, labels: tuple[str, ...], daemon: Daemon, **kw) -> MetricSpec:
    spec = MetricSpec(name, kind, help, labels, daemon, **kw)
    SPECS.append(spec)
    return spec


_S, _M, _P = Daemon.SCHEDULER, Daemon.GPU_MANAGER, Daemon.PROCURER
_TRITON_MODEL = (MODEL, VERSION)

# -- scheduler: inference per model (Triton's names), queues, batches, SLO, placement ----------------
INFERENCE_REQUEST_SUCCESS = _spec(
    "nv_inference_request_success",
    Kind.EXACT_COUNTER,
    "Number of successful inference requests, all batch sizes (one request is one GPU job)",
    _TRITON_MODEL,
    _S,
)
INFERENCE_REQUEST_FAILURE = _spec(
    "nv_inference_request_failure",
    Kind.EXACT_COUNTER,
    "Number of failed inference requests, all batch sizes (any answer but 200, deadline misses included)",
    _TRITON_MODEL,
    _S,
)
INFERENCE_COUNT = _spec(
    "nv_inference_count",
    Kind.EXACT_COUNTER,
    "Number of inferences performed (one request counts as batch size inferences)",
    _TRITON_MODEL,
    _S,
)
INFERENCE_EXEC_COUNT = _spec(
    "nv_inference_exec_count",
    Kind.EXACT_COUNTER,
    "Number of model executions performed (inference count / execution count = average batch size)",
    _TRITON_MODEL,
    _S,
)
INFERENCE_QUEUE_DURATION_US = _spec(
    "nv_inference_queue_duration_us",
    Kind.EXACT_COUNTER,
    "Cumulative inference queuing duration in microseconds (from admission to dispatch to a unit)",
    _TRITON_MODEL,
    _S,
)
INFERENCE_COMPUTE_INFER_DURATION_US = _spec(
    "nv_inference_compute_infer_duration_us",
    Kind.EXACT_COUNTER,
    "Cumulative compute inference duration in microseconds (as the unit's GPU Manager measured it)",
    _TRITON_MODEL,
    _S,
)
QUEUE_DEPTH = _spec(
    "faas_gpu_queue_depth",
    Kind.GAUGE,
    "GPU jobs waiting in the scheduler (not yet running), by request class",
    (CLASS,),
    _S,
    collected=True,
)
BATCH_SIZE = _spec(
    "faas_gpu_batch_size",
    Kind.HISTOGRAM,
    "Rows in each GPU job (the batch the function's instance formed), per function",
    (FUNCTION,),
    _S,
    buckets=BATCH_BUCKETS,
)
SLO_JOBS = _spec(
    "faas_gpu_slo_jobs_total",
    Kind.COUNTER,
    "Strict GPU jobs with an SLO, by whether they were answered within it or over it "
    "(over: answered late, or not run because the deadline passed while waiting), per function and app",
    (FUNCTION, APP, SLO),
    _S,
)
PLACEMENT_DECISIONS = _spec(
    "faas_gpu_placement_decisions_total",
    Kind.COUNTER,
    "Jobs placed on a unit by the placement policy, by whether the unit held the model (cache hit) or not",
    (POLICY, CACHE),
    _S,
)
PLACEMENT_DURATION = _spec(
    "faas_gpu_placement_duration_seconds",
    Kind.HISTOGRAM,
    "Time the placement policy took for one round that placed at least one job",
    (POLICY,),
    _S,
    buckets=PLACEMENT_BUCKETS,
)
SCHEDULER_LEADER = _spec(
    "faas_gpu_scheduler_leader",
    Kind.GAUGE,
    "1 while this scheduler replica is the leader (the one that places jobs), else 0",
    (),
    _S,
    collected=True,
)

# -- GPU Manager: units (Triton's GPU names), model cache, MIG ---------------------------------------
GPU_UTILIZATION = _spec(
    "nv_gpu_utilization",
    Kind.GAUGE,
    "GPU utilization rate [0.0 - 1.0) (NVML on a whole GPU; on MIG, cpu and sim units the share of "
    "time the unit ran a job since the previous scrape)",
    (GPU_UUID,),
    _M,
    collected=True,
)
GPU_MEMORY_TOTAL = _spec(
    "nv_gpu_memory_total_bytes",
    Kind.GAUGE,
    "GPU total memory, in bytes (NVML; on cpu and sim units the unit's emulated memory)",
    (GPU_UUID,),
    _M,
    collected=True,
)
GPU_MEMORY_USED = _spec(
    "nv_gpu_memory_used_bytes",
    Kind.GAUGE,
    "GPU used memory, in bytes (NVML; on cpu and sim units the models cached on the unit)",
    (GPU_UUID,),
    _M,
    collected=True,
)
UNIT_INFO = _spec(
    "faas_gpu_unit_info",
    Kind.GAUGE,
    "1 per unit of this GPU Manager, with its kind, GPU index and MIG profile",
    (UNIT, KIND, GPU, PROFILE),
    _M,
    collected=True,
)
MODELS_CACHED = _spec(
    "faas_gpu_models_cached",
    Kind.GAUGE,
    "Models resident in the unit's model cache",
    (UNIT,),
    _M,
    collected=True,
)
MODEL_CACHE_HITS = _spec(
    "faas_gpu_model_cache_hits_total",
    Kind.COUNTER,
    "Jobs whose model was already loaded on the unit",
    (UNIT,),
    _M,
)
MODEL_CACHE_MISSES = _spec(
    "faas_gpu_model_cache_misses_total",
    Kind.COUNTER,
    "Jobs whose model had to be loaded on the unit first",
    (UNIT,),
    _M,
)
MODEL_LOADS = _spec(
    "faas_gpu_model_loads_total",
    Kind.COUNTER,
    "Models loaded on the unit (a worker started with the model)",
    (UNIT,),
    _M,
)
MODEL_EVICTIONS = _spec(
    "faas_gpu_model_evictions_total",
    Kind.COUNTER,
    "Models evicted from the unit's cache to make room for another (least recently used first)",
    (UNIT,),
    _M,
)
MODEL_LOAD_SECONDS = _spec(
    "faas_gpu_model_load_seconds",
    Kind.HISTOGRAM,
    "Time to load a model on the unit, evictions included",
    (UNIT,),
    _M,
    buckets=LOAD_BUCKETS,
)
MIG_RECONFIGURATIONS = _spec(
    "faas_gpu_mig_reconfigurations_total",
    Kind.COUNTER,
    "MIG geometry changes asked of a GPU, by result (done, refused before anything changed, failed mid-way)",
    (GPU, RESULT),
    _M,
)

# -- procurer: nodes and dollars ---------------------------------------------------------------------
PROCUREMENT_NODES = _spec(
    "faas_gpu_procurement_nodes",
    Kind.GAUGE,
    "Nodes the procurer holds, by kind (spot, on-demand) and state (booting, ready, cordoned)",
    (KIND, STATE),
    _P,
    collected=True,
)
PROCUREMENT_TARGET_NODES = _spec(
    "faas_gpu_procurement_target_nodes",
    Kind.GAUGE,
    "Nodes the procurement policy keeps ready",
    (),
    _P,
    collected=True,
)
PROCUREMENT_DOLLARS = _spec(
    "faas_gpu_procurement_dollars_total",
    Kind.COUNTER,
    "Dollars spent on procured nodes since the procurer started, by kind",
    (KIND,),
    _P,
    collected=True,
)
PROCUREMENT_ON_DEMAND_EQUIVALENT = _spec(
    "faas_gpu_procurement_on_demand_equivalent_dollars_total",
    Kind.COUNTER,
    "What the same node time would have cost all on-demand (savings = 1 - dollars / this)",
    (),
    _P,
    collected=True,
)
PROCUREMENT_PRICE = _spec(
    "faas_gpu_procurement_price_dollars_per_hour",
    Kind.GAUGE,
    "The price of one node now, by kind",
    (KIND,),
    _P,
    collected=True,
)
PROCUREMENT_EVENTS = _spec(
    "faas_gpu_procurement_events_total",
    Kind.COUNTER,
    "Procurement events by kind of node: acquired, failed (an acquisition refused), notice (an eviction "
    "notice), evicted, released (notice, evicted and released carry an empty kind)",
    (EVENT, KIND),
    _P,
    collected=True,
)

BY_NAME: dict[str, MetricSpec] = {s.name: s for s in SPECS}
assert len(BY_NAME) == len(SPECS), "a metric name is declared twice"


def family_name(spec: MetricSpec) -> str:
    """The family name a scrape's parser reports (prometheus_client drops a counter's _total)."""
    return spec.name[: -len("_total")] if spec.kind is Kind.COUNTER else spec.name


def for_daemon(daemon: Daemon) -> list[MetricSpec]:
    return [s for s in SPECS if s.daemon is daemon]


def markdown() -> str:
    """The README's table (`python -m faas_gpu.contract.metrics`); a test keeps the README equal to it."""
    rows = ["| metric | type | labels | daemon | what it is |", "| --- | --- | --- | --- | --- |"]
    for s in SPECS:
        labels = ", ".join(f"`{label}`" for label in s.labels) or "-"
        kind = "counter" if s.kind is Kind.EXACT_COUNTER else s.kind.value
        rows.append(f"| `{s.name}` | {kind} | {labels} | {s.daemon.value} | {s.help} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
