"""GPU Reconfigurator: which geometry each GPU should have, and when to change it (PROTEAN §4.4, Alg. 2).

Every monitor interval W, per GPU:
  a. predict the number of BE batches resident on the GPU (EWMA of what was observed), so the
     GPU is sliced in advance for work arriving after the ~2 s reconfiguration;
  b. their memory: pred_BE_num x the BE model's batch memory;
  c. the first small slice set of [[1g, 2g], [3g]] whose memory holds it;
  d/e. thresholds on that set's potential occupancy (BE memory / set memory):
     T_low, below which strict and BE are better consolidated on a 3g (fewer BE batches than
     `low_batches`), and T_high, above which the small slices would overflow (`high_occupancy`);
  f. out of bounds, or no set fits: the (4g, 3g) fallback; otherwise the set plus a 4g,
     i.e. (4g, 2g, 1g) or (4g, 3g);
  (extension, `strict_aware`: when the predicted strict batches overflow what the 4g holds
  within `strict_eta_limit`, strict work would land on the small slices beside BE, so T_high
  drops to 0 and the GPU keeps a 3g for it: (4g, 3g));
  g. a mismatch with the current geometry reconfigures only once the same mismatch has been
     seen `wait_limit` (3) times in a row before (Alg. 2's wait counter), so a passing blip
     does not cost a reconfiguration.
At most `max_fraction` (30%) of the GPUs reconfigure at once; the rest wait their turn. A
`Reconfiguration` tells the driver to stop placing on the GPU, let its running batches finish
(drain), then re-slice it, which takes `reconfig_s` (~2 s).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .mig import Geometry
from .slowdown import Assumptions, SlowdownModel


@dataclass(frozen=True)
class GpuObservation:
    """What the monitor saw of one GPU over the last interval."""

    gpu: Hashable
    geometry: Geometry
    be_batches: float  # BE batches resident on the GPU (queued + running), mean over the interval
    be_model: str | None  # the BE model being served (None: no BE work)
    busy: bool = False  # draining or being reconfigured now
    strict_batches: float = 0.0  # strict batches resident, mean over the interval (used when strict_aware)
    strict_model: str | None = None


@dataclass(frozen=True)
class Reconfiguration:
    """Drain `gpu`, then re-slice it from `current` to `target`; ready about `reconfig_s` after it drained."""

    gpu: Hashable
    current: Geometry
    target: Geometry
    decided_at: float
    reconfig_s: float
    drain_first: bool = True


@dataclass
class ReconfigDecision:
    reconfigure: list[Reconfiguration] = field(default_factory=list)
    targets: dict[Hashable, Geometry] = field(default_factory=dict)  # Alg. 2's choice per GPU
    held_by_cap: list[Hashable] = field(default_factory=list)  # due, but over the 30% cap this time


@dataclass(frozen=True)
class ReconfigSettings:
    small_slice_sets: tuple[tuple[str, ...], ...] = (("1g", "2g"), ("3g",))
    large: str = "4g"
    fallback: tuple[str, ...] = ("4g", "3g")
    ewma_alpha: float = 0.5
    wait_limit: int = 3
    max_fraction: float = 0.3
    reconfig_s: float = 2.0
    low_batches: float = 1.0
    high_occupancy: float = 0.9
    strict_aware: bool = False  # T_high also 0 when the strict load overflows the large slice (our extension)
    strict_eta_limit: float = 2.4
    strict_hysteresis: float = 0.5  # back from (4g, 3g) only once strict load is under this share of the 4g's

    def __post_init__(self) -> None:
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha: must be in (0, 1], got {self.ewma_alpha}")
        if self.wait_limit < 0:
            raise ValueError(f"wait_limit: must be >= 0, got {self.wait_limit}")
        if not 0 < self.max_fraction <= 1:
            raise ValueError(f"max_fraction: must be in (0, 1], got {self.max_fraction}")


@dataclass
class _GpuState:
    predicted: float | None = None
    predicted_strict: float | None = None
    wait_ctr: int = 0
    pending_target: Geometry | None = None


class Reconfigurator:
    """Algorithm 2 for a cluster of GPUs of one model; it keeps per-GPU EWMA and wait counters."""

    def __init__(self, slowdown: SlowdownModel, settings: ReconfigSettings | None = None):
        self.slowdown = slowdown
        self.gpu = slowdown.gpu
        self.settings = settings or ReconfigSettings()
        s = self.settings
        self.fallback = self.gpu.validate(s.fallback)
        for ss in s.small_slice_sets:
            self.gpu.validate((*ss, s.large))
        self._state: dict[Hashable, _GpuState] = {}
        # a slice's memory where the live GPUs report it (NVML's, e.g. 4864 MiB for 1g.5gb), by
        # profile key; the profile table's nominal size otherwise (the simulator has no reports)
        self.slice_memory_mb: dict[str, float] = {}

    # -- Alg. 2, lines 8-23 (pure given the prediction) ---------------------------------------

    def set_memory_mb(self, slice_set: Sequence[str]) -> float:
        """The slice set's memory: reported sizes where `slice_memory_mb` has them, else nominal."""
        return sum(self.slice_memory_mb.get(k) or self.gpu.memory_mb(k) for k in slice_set)

    def thresholds(self, slice_set: Sequence[str], be_model: str | None) -> tuple[float, float]:
        """(T_low, T_high) on the set's potential occupancy (BE memory / set memory)."""
        if not be_model:
            return (math.inf, self.settings.high_occupancy)  # no BE model: nothing to isolate
        per_batch = self.slowdown.spec(be_model).mem_mb
        return (self.settings.low_batches * per_batch / self.set_memory_mb(slice_set), self.settings.high_occupancy)

    def strict_capacity(self, strict_model: str) -> int:
        """Strict batches the large slice holds with eta (SM share counted) within `strict_eta_limit`."""
        k = 0
        while k < 64:
            e = self.slowdown.eta(strict_model, self.settings.large, [strict_model] * k, sm_share=True)
            if e > self.settings.strict_eta_limit:
                break
            k += 1
        return k

    def target_geometry(
        self,
        pred_be_num: float,
        be_model: str | None,
        pred_strict: float = 0.0,
        strict_model: str | None = None,
        current: Geometry | None = None,
    ) -> Geometry:
        pred_mem = pred_be_num * self.slowdown.spec(be_model).mem_mb if be_model else 0.0
        overflow = False
        if self.settings.strict_aware and strict_model is not None:
            cap = float(self.strict_capacity(strict_model))
            if current is not None and self.gpu.normalize(current) == self.fallback:
                cap *= self.settings.strict_hysteresis  # leave (4g, 3g) only on a clear drop
            overflow = pred_strict > cap
        for slice_set in self.settings.small_slice_sets:
            cap = self.set_memory_mb(slice_set)
            if cap >= pred_mem:
                occupancy = pred_mem / cap
                t_low, t_high = self.thresholds(slice_set, be_model)
                if overflow:  # strict batches would spill onto the small slices, beside BE: too slow there
                    t_high = 0.0
                if occupancy < t_low or occupancy > t_high:
                    return self.fallback
                return self.gpu.normalize((*slice_set, self.settings.large))
        return self.fallback

    # -- the monitor loop's step --------------------------------------------------------------

    def predict(self, gpu: Hashable, be_batches: float, strict_batches: float = 0.0) -> tuple[float, float]:
        """EWMA of the BE (and strict) batches resident on the GPU."""
        st = self._state.setdefault(gpu, _GpuState())
        a = self.settings.ewma_alpha
        st.predicted = be_batches if st.predicted is None else a * be_batches + (1 - a) * st.predicted
        st.predicted_strict = (
            strict_batches if st.predicted_strict is None else a * strict_batches + (1 - a) * st.predicted_strict
        )
        return st.predicted, st.predicted_strict

    def observe(self, observations: Sequence[GpuObservation], now: float) -> ReconfigDecision:
        s = self.settings
        out = ReconfigDecision()
        due: list[tuple[int, int, GpuObservation, Geometry]] = []
        for order, ob in enumerate(observations):
            pred, pred_strict = self.predict(ob.gpu, ob.be_batches, ob.strict_batches)
            st = self._state[ob.gpu]
            if ob.busy:
                continue
            target = self.target_geometry(pred, ob.be_model, pred_strict, ob.strict_model, ob.geometry)
            out.targets[ob.gpu] = target
            current = self.gpu.normalize(ob.geometry)
            if current == target:
                st.wait_ctr, st.pending_target = 0, None
                continue
            if st.pending_target != target:  # a different mismatch: start counting again
                st.wait_ctr, st.pending_target = 0, target
            if st.wait_ctr >= s.wait_limit:
                due.append((-st.wait_ctr, order, ob, target))
            else:
                st.wait_ctr += 1
        cap = max(1, math.floor(s.max_fraction * len(observations)))
        slots = max(0, cap - sum(1 for ob in observations if ob.busy))
        for _, _, ob, target in sorted(due, key=lambda d: (d[0], d[1])):
            if slots <= 0:
                out.held_by_cap.append(ob.gpu)
                continue
            slots -= 1
            st = self._state[ob.gpu]
            st.wait_ctr, st.pending_target = 0, None
            out.reconfigure.append(Reconfiguration(ob.gpu, self.gpu.normalize(ob.geometry), target, now, s.reconfig_s))
        return out


def reconfigurator_from_assumptions(a: Assumptions, **overrides: Any) -> Reconfigurator:
    """Alg. 2 with the settings of the assumptions file; the simulator and the scheduler build it so."""
    setting = a.setting
    settings = {
        "ewma_alpha": float(setting("policy", "ewma_alpha")),
        "wait_limit": int(setting("policy", "wait_limit")),
        "max_fraction": float(setting("policy", "max_reconfig_fraction")),
        "reconfig_s": float(setting("policy", "reconfig_s")),
        "low_batches": float(setting("policy", "low_threshold_batches")),
        "high_occupancy": float(setting("policy", "high_threshold_occupancy")),
        "strict_eta_limit": float(setting("policy", "strict_eta_limit")),
        **overrides,
    }
    return Reconfigurator(a.slowdown, ReconfigSettings(**settings))
