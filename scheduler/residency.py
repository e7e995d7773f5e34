"""What PROTEAN's GPU Reconfigurator observes (§4.4, Alg. 2): the jobs resident on each GPU.

Every sample counts the jobs resident per GPU (a GPU = node + GPU index): running on or queued
in the local queue of one of its MIG units, best-effort and strict apart, with their models
(`X-Faas-Gpu-Model`). Jobs still in the global queues could go to any GPU, so each GPU counts an
equal share of them (`resident_counts`). `ResidencyMeter` turns the samples into the mean over
the monitor interval W, with the models resident the longest. The Job Distribution
(`scheduler.distribution`) counts the same way, so both read one notion of "resident".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Gpu = tuple[str, int]  # (node, GPU index)
CountKey = tuple[Gpu, bool, str | None]  # (GPU, best-effort, model)


@dataclass(frozen=True)
class Residency:
    """Mean jobs resident on one GPU over a monitor interval, and the models resident the longest."""

    best_effort: float = 0.0
    strict: float = 0.0
    be_model: str | None = None
    strict_model: str | None = None


class ResidencyMeter:
    """Time-weighted means of resident job counts between two reads (Alg. 2's monitor interval).

    `sample(now, counts)`: from `now` on the counts are these (the previous ones held until
    then). `means(now)`: the mean of each GPU's counts since the last read; the read starts the
    next interval.
    """

    def __init__(self, start: float = 0.0):
        self._since = self._last = start
        self._counts: dict[CountKey, float] = {}
        self._area: dict[CountKey, float] = defaultdict(float)

    def sample(self, now: float, counts: Mapping[CountKey, float]) -> None:
        self._advance(now)
        self._counts = {k: float(v) for k, v in counts.items() if v}

    def _advance(self, now: float) -> None:
        dt = now - self._last
        if dt > 0:
            for k, v in self._counts.items():
                self._area[k] += v * dt
            self._last = now

    def means(self, now: float) -> dict[Gpu, Residency]:
        self._advance(now)
        span = self._last - self._since
        values = {k: a / span for k, a in self._area.items()} if span > 0 else dict(self._counts)
        self._area = defaultdict(float)
        self._since = self._last
        totals: dict[Gpu, list[float]] = defaultdict(lambda: [0.0, 0.0])
        by_model: dict[tuple[Gpu, bool], dict[str, float]] = defaultdict(dict)
        for (gpu, best_effort, model), v in values.items():
            totals[gpu][0 if best_effort else 1] += v
            if model is not None:
                by_model[(gpu, best_effort)][model] = by_model[(gpu, best_effort)].get(model, 0.0) + v

        def top(gpu: Gpu, best_effort: bool) -> str | None:
            models = by_model.get((gpu, best_effort))
            return max(sorted(models), key=lambda m: models[m]) if models else None

        return {g: Residency(be, st, top(g, True), top(g, False)) for g, (be, st) in totals.items()}


def resident_counts(
    jobs: Iterable[tuple[str | None, bool, str | None]], unit_gpu: Mapping[str, Gpu], gpus: Iterable[Gpu]
) -> dict[CountKey, float]:
    """Jobs (node/unit key or None, best-effort, model) → counts per (GPU, best-effort, model).

    A job on a unit counts for that unit's GPU (units of GPUs not managed here are left out); a
    job in the global queues counts 1/n for each of the n GPUs it may still go to (`gpus`).
    """
    spread = sorted(set(gpus))
    share = 1.0 / len(spread) if spread else 0.0
    out: dict[CountKey, float] = defaultdict(float)
    for key, best_effort, model in jobs:
        if key is None:
            for g in spread:
                out[(g, best_effort, model)] += share
        elif key in unit_gpu:
            out[(unit_gpu[key], best_effort, model)] += 1.0
    return dict(out)
