"""The seam every scaling policy plugs into: a context in, a decision (and the policy's state) out.

Ray Serve's `autoscaling_policy` is the model. Each period the router hands a function's policy
a `ScalingContext` (the function's record, the load the gateway observed, the replicas the last
decision left, the time, and the state the policy returned last time) and gets a
`ScalingDecision` back: the replicas the function should run, the per-instance plan when the
policy sizes each instance itself, and the state to hand back next time. The router applies the
decision (runtime plan, stored replica count); policies never touch the runtime, so one loop
scales every function and a new policy is one module, not another branch in the loop.

Besides the periodic `decide`, a policy answers the moments OpenFaaS has: a deploy (`adopt`), a
scale request (`scale_to`, from `POST /system/scale-function`), a request for a function at zero
(`scale_from_zero`), and the hot path (`arrived`: what the meter counts a request under; `pick`:
which ready instance serves it).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..runtime import InstanceSpec
from ..types import FunctionRecord

Key = tuple[str, str]


@dataclass(frozen=True)
class Load:
    """What the gateway saw of one function: counts since it was deployed, in flight now, and
    the most in flight since the last decision (a burst that came and went within one period)."""

    arrivals: int = 0
    by_app: Mapping[str, int] = field(default_factory=dict)
    in_flight: int = 0
    peak_in_flight: int = 0
    ok: int = 0
    """Requests answered 200: what `gateway_function_invocation_total{code="200"}` counts, the
    series OpenFaaS CE's autoscaling alert is written over (`scaling.replicas`)."""


class LoadMeter:
    """The hot path's counters for one function, read by the loop once a period.

    Kept by the router, not by each policy, so every policy sees the same observations and a
    policy only says what a request counts under (`ScalingPolicy.arrived`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals = 0
        self._by_app: dict[str, int] = {}
        self._in_flight = 0
        self._peak = 0
        self._ok = 0

    def arrive(self, label: str | None) -> None:
        with self._lock:
            self._arrivals += 1
            if label is not None:
                self._by_app[label] = self._by_app.get(label, 0) + 1
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)

    def depart(self, status: int | None = None) -> None:
        """A request is over; `status` is the replica's answer (None: it never got one)."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            if status == 200:
                self._ok += 1

    def read(self, *, new_period: bool = False) -> Load:
        """The counters now; `new_period` starts the next period's peak at what is in flight."""
        with self._lock:
            load = Load(self._arrivals, dict(self._by_app), self._in_flight, self._peak, self._ok)
            if new_period:
                self._peak = self._in_flight
        return load


@dataclass(frozen=True)
class ScalingContext:
    """One function as its policy sees it when it decides."""

    record: FunctionRecord
    load: Load
    replicas: int
    """What the last applied decision left: planned instances, or identical replicas."""
    now: float
    """The router's clock (monotonic seconds): policies read the time only from here."""
    state: Any
    """What the policy returned last time for this function (Ray Serve's `policy_state`)."""
    idle_s: float = 0.0
    """Seconds since a call of the function last arrived or was in flight (since its deploy when
    none has), as the router's periods saw it: what scale to zero waits out."""


@dataclass(frozen=True)
class ScalingDecision:
    """What a function should run. `instances` set: exactly these instances (each with its own
    env: batch size, threads, GPU share), and `replicas` is their count; None: `replicas`
    identical replicas of the function's spec."""

    state: Any
    replicas: int
    instances: tuple[InstanceSpec, ...] | None = None


class ScalingPolicy(Protocol):
    """A provider-side scaling policy. Pure algorithms stay in `faas_gpu.policies`; a plug-in
    turns annotations into their inputs and their outputs into decisions."""

    name: str
    """The value of `com.faas-gpu.scaling` that selects it (`replicas` has none: the default)."""
    managed: bool
    """False for plain OpenFaaS replicas: the invoker round-robins them itself, and
    `/system/function/<name>/instances` shows them as not managed."""

    def validate(self, record: FunctionRecord) -> None:
        """Raise ValidationError (the deploy gets 400) for annotations this policy cannot run."""

    def adopt(self, record: FunctionRecord, now: float, previous: Any | None) -> ScalingDecision:
        """A deploy or update (or a provider restart): the function's first decision. `previous`
        is this policy's state when it governed the function already (an update)."""

    def decide(self, ctx: ScalingContext) -> ScalingDecision:
        """The periodic decision; the router applies it only when it changes what runs."""

    def scale_to(self, ctx: ScalingContext, n: int) -> ScalingDecision:
        """A scale request (already clamped to com.openfaas.scale.min/max): always applied."""

    def scale_from_zero(self, ctx: ScalingContext) -> ScalingDecision:
        """A request came for the function: what it runs so the request finds an instance."""

    def arrived(self, key: Key, state: Any, headers: dict[str, str] | None) -> str | None:
        """A request arrived: the label the meter counts it under (an app), or None. May raise
        BadApp (the gateway answers 400) or add to `headers` (what the instance should know)."""

    def pick(self, state: Any, ready: list[tuple[str, str]], headers: dict[str, str] | None) -> str | None:
        """The base URL of the ready instance (id, url) to serve this request."""

    def applied(self, key: Key, state: Any) -> None:
        """The runtime took a decision's plan: keep what a provider restart needs."""

    def forget(self, key: Key, *, deleted: bool) -> None:
        """Drop what is kept for the function: it now answers to another policy, or it was
        deleted (`deleted`: its history goes too)."""

    def describe(self, ctx: ScalingContext) -> dict | None:
        """The policy's view for `/system/function/<name>/instances` (None: not managed)."""
