"""Scaling policies as plug-ins: one module per policy, one router that delegates to them.

`base` holds the seam (`ScalingPolicy`, `ScalingContext`, `ScalingDecision`, the load meter),
`router` the provider's one autoscaler loop, and one module per policy: `infless` (INFless's
non-uniform instances), `harmony` (HarmonyBatch's pools), `protean` (PROTEAN's one container per
batch) and `replicas` (plain OpenFaaS replicas, the default, with CE's alert-driven autoscaling).
The algorithms themselves are the pure ones in `faas_gpu.policies`; these modules turn
annotations into their inputs.
"""

from .base import Load, LoadMeter, ScalingContext, ScalingDecision, ScalingPolicy
from .harmony import BadApp, HarmonyPools
from .infless import InflessScaling, scaled_wall
from .protean import ProteanFunctions
from .replicas import AlertState, InvocationRateRule, PlainReplicas, alert_replicas
from .router import ScalingRouter, scaling_of

__all__ = [
    "AlertState",
    "BadApp",
    "HarmonyPools",
    "InflessScaling",
    "InvocationRateRule",
    "Load",
    "LoadMeter",
    "PlainReplicas",
    "ProteanFunctions",
    "ScalingContext",
    "ScalingDecision",
    "ScalingPolicy",
    "ScalingRouter",
    "alert_replicas",
    "scaled_wall",
    "scaling_of",
]
