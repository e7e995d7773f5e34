"""The batch-aware dispatcher of §3.2: how much of a function's load each instance gets.

With R_max = sum of r_up and R_min = sum of r_low over the function's instances:
  (i)   R > R_max: every instance runs at r_up; the autoscaler scales up for R - R_max;
  (ii)  a*R_min + (1-a)*R_max <= R <= R_max: r_i = r_up_i - (R_max-R)/(R_max-R_min) * (r_up_i - r_low_i),
        so every instance sits as close to its upper bound as the load allows;
  (iii) below that: instances are released until (ii) holds again (never below `keep`),
        and the rates are computed again over the instances left.
`WeightedSplitter` then sends requests in the proportions r_i (smooth weighted round robin,
as nginx does): over any window each instance gets its share within one request, which a
random split would not guarantee for small batches.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from .capacity import ALPHA


@dataclass(frozen=True)
class InstanceLoad:
    id: Hashable
    r_low: float
    r_up: float


@dataclass
class DispatchDecision:
    case: str  # "scale-up", "steady" or "release"
    rates: dict[Hashable, float] = field(default_factory=dict)
    scale_up_rps: float = 0.0
    release: list[Hashable] = field(default_factory=list)


def _rates(instances: Sequence[InstanceLoad], rps: float) -> dict[Hashable, float]:
    r_max = sum(i.r_up for i in instances)
    r_min = sum(i.r_low for i in instances)
    if rps >= r_max:
        return {i.id: i.r_up for i in instances}
    if r_max > r_min and rps >= r_min:
        frac = (r_max - rps) / (r_max - r_min)
        return {i.id: i.r_up - frac * (i.r_up - i.r_low) for i in instances}
    # under every lower bound (only when instances cannot be released): share by capacity
    return {i.id: rps * i.r_up / r_max if r_max else 0.0 for i in instances}


def dispatch(instances: Sequence[InstanceLoad], rps: float, *, alpha: float = ALPHA, keep: int = 0) -> DispatchDecision:
    """The three cases; `keep` instances are never released (com.openfaas.scale.min)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must be in [0, 1], got {alpha}")
    live = list(instances)
    r_max = sum(i.r_up for i in live)
    if rps > r_max:
        return DispatchDecision("scale-up", _rates(live, rps), scale_up_rps=rps - r_max)
    released: list[Hashable] = []

    def low_water(group: Sequence[InstanceLoad]) -> float:
        return alpha * sum(i.r_low for i in group) + (1 - alpha) * sum(i.r_up for i in group)

    while len(live) > keep and rps < low_water(live):
        left = sum(i.r_up for i in live)
        # release the instance that is hardest to keep saturated, among those whose removal
        # still leaves room for the whole load
        candidates = [i for i in live if left - i.r_up >= rps]
        if not candidates:
            break
        victim = max(candidates, key=lambda i: (i.r_low, -i.r_up))
        live.remove(victim)
        released.append(victim.id)
    case = "release" if released else "steady"
    return DispatchDecision(case, _rates(live, rps), release=released)


class WeightedSplitter:
    """Smooth weighted round robin over instance ids, weights = their dispatched rates."""

    def __init__(self) -> None:
        self._weights: dict[Hashable, float] = {}
        self._current: dict[Hashable, float] = {}

    def set_weights(self, weights: dict[Hashable, float]) -> None:
        self._weights = {k: max(0.0, float(w)) for k, w in weights.items()}
        self._current = {k: self._current.get(k, 0.0) for k in self._weights}

    @property
    def weights(self) -> dict[Hashable, float]:
        return dict(self._weights)

    def pick(self, available: Sequence[Hashable]) -> Hashable | None:
        """The next instance among `available`; those with no weight share equally."""
        if not available:
            return None
        weights = {k: self._weights.get(k, 0.0) for k in available}
        total = sum(weights.values())
        if total <= 0:
            weights = dict.fromkeys(available, 1.0)
            total = float(len(available))
        best, best_score = None, None
        for k in available:
            score = self._current.get(k, 0.0) + weights[k]
            self._current[k] = score
            if best_score is None or score > best_score:
                best, best_score = k, score
        self._current[best] -= total
        return best
