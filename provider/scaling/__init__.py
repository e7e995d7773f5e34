"""Scaling policies as plug-ins: one module per policy, one router that delegates to them.

`base` holds the seam (`ScalingPolicy`, `ScalingContext`, `ScalingDecision`, the load meter),
`router` the provider's one autoscaler loop, and one module per policy: `infless` (INFless's
non-uniform instances), `harmony` (HarmonyBatch's pools), `protean` (PROTEAN's one container per
batch) and `replicas` (plain OpenFaaS replicas, the default). The algorithms themselves are the
pure ones in `faas_gpu.policies`; these modules turn annotations into their inputs.
"""

from .base import Load, LoadMeter, ScalingContext, ScalingDecision, ScalingPolicy
from .harmony import BadApp, HarmonyPools
from .infless import InflessScaling
from .protean import ProteanFunctions
from .replicas import PlainReplicas
from .router import ScalingRouter, scaling_of

__all__ = [
    "BadApp",
    "HarmonyPools",
    "InflessScaling",
    "Load",
    "LoadMeter",
    "PlainReplicas",
    "ProteanFunctions",
    "ScalingContext",
    "ScalingDecision",
    "ScalingPolicy",
    "ScalingRouter",
    "scaling_of",
]
