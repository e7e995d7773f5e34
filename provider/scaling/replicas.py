"""Plain OpenFaaS replicas: the policy of a function that names no faas-gpu scaling.

Such a function runs `replicas` identical replicas, changed only by a scale request (or by a
request that finds it at zero), as OpenFaaS CE without its Pro autoscaler does; the replicas
stay within `com.openfaas.scale.min` / `.max` (the scale request is clamped before it gets here).
"""

from __future__ import annotations

import itertools

from ..types import FunctionRecord
from .base import Key, ScalingContext, ScalingDecision


class PlainReplicas:
    """The default policy: no state, no periodic change, scale requests applied as asked."""

    name = "replicas"
    managed = False

    def __init__(self) -> None:
        self._rr = itertools.count()

    def validate(self, record: FunctionRecord) -> None:
        """Only the deployment's own validation (scale labels included) applies."""

    def adopt(self, record: FunctionRecord, now: float, previous: object | None) -> ScalingDecision:
        return ScalingDecision(None, record.replicas)

    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        return ScalingDecision(None, ctx.replicas)

    def scale_to(self, ctx: ScalingContext, n: int) -> ScalingDecision:
        return ScalingDecision(None, n)

    def scale_from_zero(self, ctx: ScalingContext) -> ScalingDecision:
        lo, _hi = ctx.record.deployment.scale_bounds()
        return ScalingDecision(None, ctx.replicas if ctx.replicas > 0 else max(1, lo))

    def arrived(self, key: Key, state: object, headers: dict[str, str] | None) -> str | None:
        return None

    def pick(self, state: object, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        """Round robin (the invoker does the same for functions no policy manages)."""
        return ready[next(self._rr) % len(ready)][1] if ready else None

    def applied(self, key: Key, state: object) -> None:
        """Nothing to keep: the record holds the count."""

    def forget(self, key: Key, *, deleted: bool) -> None:
        """Nothing is kept."""

    def describe(self, ctx: ScalingContext) -> dict | None:
        return None  # `/instances` lists the runtime's replicas as not managed
