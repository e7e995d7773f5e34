"""What INFless scaling reads and keeps per function: its annotations, its instances, its state.

Apart from `infless.py` (the decisions) so the annotation rules and the wire forms of an
instance (the env it runs with, the JSON a restarted provider reads back) have one place.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.contract import env as contract_env
from faas_gpu.policies.infless import (
    Candidate,
    FixedKeepAlive,
    KeepAlivePolicy,
    RateWindow,
    WeightedSplitter,
    keepalive_policy,
    rate_window,
)

from ..runtime import InstanceSpec
from ..types import FunctionRecord, ValidationError
from ..validation import SCALE_ZERO_DURATION_LABEL, zero_after_s

MODEL = annotation_keys.MODEL
SLO = annotation_keys.SLO_MS
BEST_EFFORT = annotation_keys.BEST_EFFORT
KEEP_ALIVE = annotation_keys.KEEP_ALIVE
SCALE_ZERO = annotation_keys.SCALE_ZERO  # LSTH's scale to zero, with pre-warming


class Predictor(Protocol):
    def configs(self, model: str, gpu: bool = False) -> list[tuple[int, int, int, float]]:
        """Every profiled (batch, cpu threads, gpu share %, predicted ms); LookupError when none."""

    def path_cost(self, node: str = "local") -> tuple[float, ...] | None:
        """The serving path's own cost on the node: (fixed ms per batch, ms per request), optionally
        followed by the CPU ms its processes spend per batch and per request; or None."""


@dataclass(frozen=True)
class FunctionPolicy:
    """What a function's annotations and labels ask of INFless scaling."""

    model: str
    slo_s: float
    best_effort: bool
    keepalive: KeepAlivePolicy
    scale_zero: bool
    """The keep-alive may take the function to zero: `com.faas-gpu.scale-zero` (LSTH, pre-warming
    before the arrival it predicts) or OpenFaaS Pro's `com.openfaas.scale.zero` (a fixed window of
    `com.openfaas.scale.zero-duration`, unless com.faas-gpu.keep-alive names the policy)."""
    min_instances: int
    max_instances: int

    @classmethod
    def of(cls, record: FunctionRecord) -> FunctionPolicy | None:
        ann = record.deployment.annotations or {}
        if MODEL not in ann:
            return None
        model = ann[MODEL].strip()
        if not model:
            raise ValidationError(f"annotations: {MODEL} must name a profiled model")
        raw = ann.get(SLO)
        if raw is None:
            raise ValidationError(f"annotations: {SLO} is required with {MODEL} (the latency SLO in ms)")
        annotation_keys.SLO_CHECK(f"annotations: {SLO}", raw)  # the deploy rule, for records read back too
        slo_ms = float(raw)
        lo, hi = record.deployment.scale_bounds()
        labels = record.deployment.labels or {}
        zero_after = zero_after_s(labels)
        if KEEP_ALIVE in ann and SCALE_ZERO_DURATION_LABEL in labels:
            raise ValidationError(
                f"labels: {SCALE_ZERO_DURATION_LABEL} and annotations: {KEEP_ALIVE} both say how long the function "
                "is kept warm; give one"
            )
        lsth_zero = _flag(ann, SCALE_ZERO) and SCALE_ZERO_DURATION_LABEL not in labels
        if KEEP_ALIVE in ann or zero_after is None or lsth_zero:
            keepalive = _keepalive(ann.get(KEEP_ALIVE, "lsth"))
        else:  # OpenFaaS's scale to zero: no call for zero-duration
            keepalive = FixedKeepAlive(zero_after)
        return cls(
            model,
            slo_ms / 1000.0,
            _flag(ann, BEST_EFFORT),
            keepalive,
            _flag(ann, SCALE_ZERO) or zero_after is not None,
            lo,
            hi,
        )


def _flag(values: dict[str, str], key: str) -> bool:
    raw = values.get(key, "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise ValidationError(f"{key}: must be true or false, got {values[key]!r}")
    return raw in ("true", "1")


def _keepalive(raw: str) -> KeepAlivePolicy:
    """`lsth` (default), `hhp`, or a fixed window such as `300s` / `fixed:5m` (`keepalive_policy`,
    the one place the simulator's replay builds it too)."""
    try:
        return keepalive_policy(raw)
    except ValueError:
        raise ValidationError(f"annotations: {KEEP_ALIVE} must be lsth, hhp or a duration, got {raw!r}") from None


@dataclass
class Instance:
    id: str
    candidate: Candidate
    r_low: float
    r_up: float
    timeout_s: float
    server: str
    gpu_index: int | None
    created: float
    rate: float = 0.0

    @classmethod
    def new(
        cls,
        function: str,
        c: Candidate,
        r_low: float,
        r_up: float,
        timeout_s: float,
        server: str,
        gpu_index: int | None,
        now: float,
    ) -> Instance:
        """A new instance; its id says its configuration (`fn-b4c2g30-1a2b`) and is unique."""
        rid = f"{function}-b{c.batch}c{int(c.cpu)}" + (f"g{int(c.gpu)}" if c.gpu else "")
        return cls(f"{rid}-{uuid.uuid4().hex[:4]}", c, r_low, r_up, timeout_s, server, gpu_index, now)

    def env(self, slo_s: float) -> dict[str, str]:
        c = self.candidate
        env = {
            contract_env.MAX_BATCH.name: str(c.batch),
            contract_env.BATCH_TIMEOUT_MS.name: f"{self.timeout_s * 1000:.3f}",
            contract_env.CPU_THREADS.name: str(max(1, int(c.cpu))),
            contract_env.SLO_MS.name: f"{slo_s * 1000:g}",
        }
        if c.gpu:
            env[contract_env.GPU_SHARE.name] = str(int(c.gpu))
        return env

    def spec(self, slo_s: float) -> InstanceSpec:
        return InstanceSpec(self.id, self.env(slo_s))

    def to_json(self) -> dict:
        c = self.candidate
        return {
            "id": self.id,
            "batch": c.batch,
            "cpu": c.cpu,
            "gpuShare": c.gpu,
            "tExecMs": round(c.t_exec_s * 1000, 3),
            "pathMs": round(c.path_s * 1000, 3),
            "rLow": self.r_low,
            "rUp": self.r_up,
            "batchTimeoutMs": round(self.timeout_s * 1000, 3),
            "rate": round(self.rate, 3),
            "server": self.server,
        }

    @classmethod
    def from_json(cls, d: dict, now: float) -> Instance:
        c = Candidate(
            int(d["batch"]),
            float(d["cpu"]),
            float(d["gpuShare"]),
            float(d["tExecMs"]) / 1000,
            float(d.get("pathMs", 0.0)) / 1000,
        )
        return cls(
            d["id"], c, float(d["rLow"]), float(d["rUp"]), float(d["batchTimeoutMs"]) / 1000, d["server"], None, now
        )


@dataclass
class InflessState:
    """One function's INFless state: its instances, the splitter the gateway weighs them with,
    and the window its arrival rate is measured over (`faas_gpu.policies.infless.rate`)."""

    record: FunctionRecord
    policy: FunctionPolicy
    instances: list[Instance] = field(default_factory=list)
    splitter: WeightedSplitter = field(default_factory=WeightedSplitter)
    rate_window: RateWindow = field(default_factory=rate_window)
    rps: float = 0.0
    done_window: RateWindow = field(default_factory=RateWindow)
    """Requests answered 200, as a rate: what the instances complete."""
    done_rps: float = 0.0
    concurrency: int = 1
    """The most requests in flight at once in the last period: no batch larger is planned."""
    model_max_batch: int | None = None
    """The largest batch the function's models accept (issue 43), as the scheduler read it from
    their archives when the replicas uploaded them; None: no limit known."""
    observed: float | None = None
    """The throughput last seen at saturation (requests queueing in front of the instances)."""
    correction: float = 1.0
    """The factor on the predicted path time that the observed capacity asked for (1: none)."""
    path_correction: float = 1.0
    """The factor on the path's CPU on the node that the observed capacity asked for (1: none);
    a shortfall moves it before `correction` (`faas_gpu.policies.infless.corrections`)."""
    ready_ids: Collection[str] = ()
    """The instances the gateway last found ready (`pick`)."""
    saturated: bool = False
    """Requests queued in front of the instances at the last decision (after the plan settled)."""
    replan: bool = False
    planned_at: float = 0.0
    observed_at: float = -math.inf
    """When `observed` was measured."""
    restarted_at: float = -math.inf
    """When a re-plan last restarted instances (changed a batch size or threads)."""
    decayed_at: float = -math.inf
    """When the corrections last faded toward 1."""
    case: str = "steady"
    windows: tuple[float, float] = (0.0, 0.0)
    called_at: float = -math.inf
    """When the last call arrived, on the keep-alive clock (`InflessScaling.wall`)."""
    provisional_s: float | None = None
    """Set while the model has no profile: the time assumed for a batch of one (the conservative
    plan's only configuration); None once planned from a profile."""
    profile_checked_at: float = -math.inf
    problem: str | None = None
    """Why a profile that arrived was not taken (an SLO it says no configuration meets)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
