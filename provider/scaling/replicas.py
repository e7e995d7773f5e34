"""Plain OpenFaaS replicas: the policy of a function that names no faas-gpu scaling.

Such a function runs `replicas` identical replicas, changed by a scale request, by a request that
finds it at zero, and by OpenFaaS CE's autoscaling. CE scales these functions with Prometheus and
AlertManager: the rule `APIHighInvocationRate` (faas-netes chart, prometheus-cfg.yaml)

    sum(rate(gateway_function_invocation_total{code="200"}[10s])) BY (function_name) > 5  for: 5s

fires, AlertManager (alertmanager-cfg.yaml: group_wait 5s, group_interval 10s, repeat_interval
30s, send_resolved) posts it to the gateway's `/system/alert`, and the gateway moves the replicas
by `alert_replicas` (gateway/handlers/alerthandler.go `CalculateReplicas`). With no Prometheus
beside faas-gpu, `InvocationRateRule` evaluates that rule and AlertManager's timing over the
gateway's own counters, once a period, from the time the router hands it (no clock is read here);
`/system/alert` stays for an external AlertManager (`faas-gpu serve --no-alert-rule` then).

With `com.openfaas.scale.zero: "true"` the function also goes to zero once no call has reached it
for `com.openfaas.scale.zero-duration` (OpenFaaS Pro's rule, `faas_gpu.policies.scale_zero`), and a
call that finds it at zero starts `com.openfaas.scale.min` replicas (at least one) and waits for
them. `com.faas-gpu.scale-zero` and `com.faas-gpu.keep-alive` (LSTH's pre-warming, which predicts
from a model's profile and history) are refused here, not ignored: they name OpenFaaS's labels.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.policies.scale_zero import ScaleToZero, wake_to

from ..types import FunctionRecord, ValidationError
from ..validation import SCALE_ZERO_DURATION_LABEL, SCALE_ZERO_LABEL, gateway_scale_bounds, scale_factor, zero_after_s
from .base import Key, ScalingContext, ScalingDecision

FIRING = "firing"
RESOLVED = "resolved"


def alert_replicas(status: str, current: int, lo: int, hi: int, factor: int) -> int:
    """CE's `CalculateReplicas`: "firing" adds ceil(max/100*factor) up to max; any other status
    (or a step of 0) goes back to min. `hi` here is already the gateway's maximum."""
    step = math.ceil(hi / 100 * factor)
    if status == FIRING and step > 0:
        return min(current + step, hi)
    return lo


@dataclass(frozen=True)
class AlertState:
    """One function's rule as Prometheus and AlertManager would hold it."""

    samples: tuple[tuple[float, int], ...] = ()
    """(time, successful invocations so far) within the rate window."""
    pending_since: float | None = None
    """Since when the expression has been true (Prometheus' pending alert)."""
    firing: bool = False
    notified_firing: bool = False
    """The last notification sent said "firing" (so a resolve is owed)."""
    sending: str | None = None
    """What the next notification says, and `next_at` when it goes (AlertManager's group timers)."""
    next_at: float | None = None


@dataclass(frozen=True)
class InvocationRateRule:
    """APIHighInvocationRate with AlertManager's timing; `evaluate` is the whole of it."""

    threshold_rps: float = 5.0
    window_s: float = 10.0
    for_s: float = 5.0
    group_wait_s: float = 5.0
    group_interval_s: float = 10.0
    repeat_interval_s: float = 30.0

    def rate(self, samples: tuple[tuple[float, int], ...]) -> float:
        """Successful invocations per second over the window (0 with fewer than two samples)."""
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return 0.0
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return max(0, c1 - c0) / (t1 - t0)

    def evaluate(self, state: AlertState, ok_count: int, now: float) -> tuple[AlertState, str | None]:
        """The state after observing `ok_count` at `now`, and the notification due now, if any."""
        samples = tuple(s for s in state.samples if s[0] >= now - self.window_s) + ((now, ok_count),)
        pending_since, firing = state.pending_since, state.firing
        if self.rate(samples) > self.threshold_rps:
            pending_since = now if pending_since is None else pending_since
            firing = firing or now - pending_since >= self.for_s
        else:
            pending_since, firing = None, False
        notified, sending, next_at = state.notified_firing, state.sending, state.next_at
        want = FIRING if firing else RESOLVED if notified else None
        if want is None:
            sending, next_at = None, None
        elif want != sending:  # the group changed: AlertManager sends it after its wait
            first = want == FIRING and not notified
            sending, next_at = want, now + (self.group_wait_s if first else self.group_interval_s)
        event = None
        if sending is not None and next_at is not None and now >= next_at:
            event = sending
            if sending == FIRING:
                notified, next_at = True, now + self.repeat_interval_s
            else:
                notified, sending, next_at = False, None, None
        new = replace(
            state,
            samples=samples,
            pending_since=pending_since,
            firing=firing,
            notified_firing=notified,
            sending=sending,
            next_at=next_at,
        )
        return new, event


class PlainReplicas:
    """The default policy: scale requests applied as asked, and CE's alert-driven autoscaling
    (`rule`; None: no periodic change, as with an external AlertManager)."""

    name = "replicas"
    managed = False

    def __init__(self, rule: InvocationRateRule | None = None) -> None:
        self._rr = itertools.count()
        self.rule = rule

    def validate(self, record: FunctionRecord) -> None:
        """The deployment's own validation (scale labels included), and no keep-alive of ours."""
        refuse_our_keep_alive(record, "a function without com.faas-gpu.model (plain replicas)")

    def adopt(self, record: FunctionRecord, now: float, previous: object | None) -> ScalingDecision:
        return ScalingDecision(previous, record.replicas)

    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        """To zero when idle (`com.openfaas.scale.zero`); else the rule's notification due now,
        applied as `/system/alert` applies AlertManager's."""
        zero = zero_after_s(ctx.record.deployment.labels)
        if zero is not None and ctx.replicas > 0 and ScaleToZero(zero).idle(ctx.idle_s, ctx.load.in_flight):
            return ScalingDecision(ctx.state, 0)
        if self.rule is None:
            return ScalingDecision(ctx.state, ctx.replicas)
        prior = ctx.state if isinstance(ctx.state, AlertState) else AlertState()
        state, event = self.rule.evaluate(prior, ctx.load.ok, ctx.now)
        if event is None or ctx.replicas == 0:  # at zero, a request scales it from zero first
            return ScalingDecision(state, ctx.replicas)
        labels = ctx.record.deployment.labels
        factor = scale_factor(labels)
        if factor == 0:
            return ScalingDecision(state, ctx.replicas)
        lo, hi = gateway_scale_bounds(labels)
        return ScalingDecision(state, alert_replicas(event, ctx.replicas, lo, hi, factor))

    def scale_to(self, ctx: ScalingContext, n: int) -> ScalingDecision:
        return ScalingDecision(ctx.state, n)

    def scale_from_zero(self, ctx: ScalingContext) -> ScalingDecision:
        lo, _hi = ctx.record.deployment.scale_bounds()
        return ScalingDecision(ctx.state, ctx.replicas if ctx.replicas > 0 else wake_to(lo))

    def arrived(self, key: Key, state: object, headers: dict[str, str] | None) -> str | None:
        return None

    def pick(self, state: object, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        """Round robin (the invoker does the same for functions no policy manages)."""
        return ready[next(self._rr) % len(ready)][1] if ready else None

    def applied(self, key: Key, state: object) -> None:
        """Nothing to keep: the record holds the count."""

    def forget(self, key: Key, *, deleted: bool) -> None:
        """Nothing is kept outside the router's state."""

    def describe(self, ctx: ScalingContext) -> dict | None:
        return None  # `/instances` lists the runtime's replicas as not managed


def refuse_our_keep_alive(record: FunctionRecord, what: str) -> None:
    """400 for `com.faas-gpu.scale-zero` / `keep-alive` on a function whose policy has no keep-alive
    of ours: accepted, they would be ignored, and the function would never go to zero."""
    ann = record.deployment.annotations or {}
    for key in (annotation_keys.SCALE_ZERO, annotation_keys.KEEP_ALIVE):
        if key in ann:
            raise ValidationError(
                f"annotations: {key} applies to functions INFless scales (a com.faas-gpu.model, whose profile and "
                f'history LSTH pre-warms from), not to {what}: use the labels {SCALE_ZERO_LABEL}: "true" and '
                f"{SCALE_ZERO_DURATION_LABEL} (a Go duration, 15m by default)"
            )
