"""PROTEAN (seed 000): strict and best-effort requests over MIG slices shared with MPS.

Pure policies, driven by `faas_gpu.sim.protean` (and, later, by the daemons) alike:
- `mig`: valid MIG geometries of a GPU's profile table (A100-40GB / H100-80GB), validation;
- `slowdown`: Eq. 2, eta = RDF x max(sum FBR, 1), calibrated / assumed in `assumptions.yaml`;
- `classes`: strict vs best-effort, the reordering queue (EDF, bounded BE wait), header parsing;
- `distribution`: Job Distribution (Algorithm 1);
- `reconfigurator`: GPU Reconfigurator (Algorithm 2);
- `autoscale`: one container per batch, delayed termination, as a pluggable scaling policy;
- `procurement`: spot first, on-demand backup, eviction handling, cost (the cloud: `faas_gpu.cloud`).

The data files (`mig_profiles.yaml`, `assumptions.yaml`) are read by `faas_gpu.policy_data.protean`
(`gpu_model`, `default_assumptions`, `parse_assumptions`), which hands the parsed data in.
"""

from .autoscale import FunctionLoad, ProteanScaling, ScaleDecision, ScaleSnapshot, ScalingPolicy, containers_needed
from .classes import (
    BE_MAX_WAIT_S,
    BE_SHARE,
    CLASS_HEADER,
    SLO_HEADER,
    ClassQueue,
    Queued,
    RequestClass,
    RequestClassChoice,
    admission_queue,
    admit,
    classify,
    parse_class,
    parse_slo_ms,
)
from .distribution import Batch, Distribution, JobDistributor, Placement, SliceState, job_distributor, tag_slices
from .mig import Geometry, GpuModel, InvalidGeometry, ProfileInfo, gpu_models_from_data
from .procurement import (
    CostMeter,
    EvictionNotice,
    Node,
    NodeKind,
    NodeState,
    PriceSeries,
    Procurement,
    ProcurementDecision,
    ProcurementSnapshot,
)
from .reconfigurator import GpuObservation, ReconfigDecision, ReconfigSettings, Reconfiguration, Reconfigurator
from .slowdown import Assumptions, ModelSpec, SlowdownModel, assumptions_from_data, eta, merge_assumptions

__all__ = [
    "BE_MAX_WAIT_S",
    "BE_SHARE",
    "CLASS_HEADER",
    "SLO_HEADER",
    "Assumptions",
    "Batch",
    "ClassQueue",
    "CostMeter",
    "Distribution",
    "EvictionNotice",
    "FunctionLoad",
    "Geometry",
    "GpuModel",
    "GpuObservation",
    "InvalidGeometry",
    "JobDistributor",
    "ModelSpec",
    "Node",
    "NodeKind",
    "NodeState",
    "Placement",
    "PriceSeries",
    "Procurement",
    "ProcurementDecision",
    "ProcurementSnapshot",
    "ProfileInfo",
    "ProteanScaling",
    "Queued",
    "ReconfigDecision",
    "ReconfigSettings",
    "Reconfiguration",
    "Reconfigurator",
    "RequestClass",
    "RequestClassChoice",
    "ScaleDecision",
    "ScaleSnapshot",
    "ScalingPolicy",
    "SliceState",
    "SlowdownModel",
    "admission_queue",
    "admit",
    "classify",
    "containers_needed",
    "assumptions_from_data",
    "eta",
    "gpu_models_from_data",
    "job_distributor",
    "merge_assumptions",
    "parse_class",
    "parse_slo_ms",
    "tag_slices",
]
