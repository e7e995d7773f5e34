"""Request-rate traces for the PROTEAN experiments, and batch arrivals drawn from them.

The paper replays a Wikipedia trace (diurnal, peak:mean 316:303) scaled to a mean of ~5,000
requests/s for vision models and 128 for language models, and a Twitter trace (erratic, peak:mean
4561:2969) scaled to a peak of ~5,000. Neither is in `../shared/data/`; we build their kin from
the Azure Functions traces that are (INFless's extracts):

- diurnal: one day (minutes 0-1439) of `azure_7day_per_minute/4.txt`, smoothed with a centred
  60-minute moving average (one function's per-minute counts of 0-16 are mostly noise; the day's
  shape is what a large service's aggregate shows), scaled to the target *mean*.
- bursty: one day (the first 144 ten-minute means) of `Bursty.txt`, scaled to the target *peak*,
  held flat within each step so the steps are abrupt.

Each day is compressed into `duration_s` seconds of simulated time: the rates are the paper's,
the duration is not (a whole day would take hours to simulate at 5,000 requests/s). The peak to
mean ratios are those of the data (1.60 diurnal, 2.09 bursty), not the paper's traces'.

Requests of a class arrive as a Poisson process with the trace's rate times the class share;
a batch forms at every `batch`-th request, so batch inter-arrivals are drawn exactly as sums of
`batch` exponential gaps in the trace's integrated-rate time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from faas_gpu.paths import SHARED_DATA

DATA = SHARED_DATA / "infless" / "workload"


@dataclass(frozen=True)
class RateTrace:
    name: str
    step_s: float
    rates: np.ndarray  # requests/s in each step
    how: str

    @property
    def duration_s(self) -> float:
        return self.step_s * len(self.rates)

    @property
    def mean_rps(self) -> float:
        return float(self.rates.mean())

    @property
    def peak_rps(self) -> float:
        return float(self.rates.max())

    def scaled(self, factor: float) -> RateTrace:
        return RateTrace(self.name, self.step_s, self.rates * factor, self.how)


def _read(path: Path) -> np.ndarray:
    return np.array([float(v) for v in path.read_text().split()])


def diurnal_trace(mean_rps: float, duration_s: float, data_dir: Path = DATA) -> RateTrace:
    day = _read(data_dir / "azure_7day_per_minute" / "4.txt")[:1440]
    padded = np.concatenate([day[-30:], day, day[:29]])  # a day wraps round
    smooth = np.convolve(padded, np.ones(60) / 60.0, mode="valid")
    rates = smooth / smooth.mean() * mean_rps
    return RateTrace(
        "diurnal",
        duration_s / len(rates),
        rates,
        "azure_7day_per_minute/4.txt day 1, 60-min moving average, scaled to the mean",
    )


def bursty_trace(peak_rps: float, duration_s: float, data_dir: Path = DATA) -> RateTrace:
    day = _read(data_dir / "Bursty.txt")[:144]
    rates = day / day.max() * peak_rps
    return RateTrace(
        "bursty", duration_s / len(rates), rates, "Bursty.txt first 144 ten-minute means, scaled to the peak"
    )


def batch_arrivals(trace: RateTrace, share: float, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Times at which batches of `batch` requests of a class with `share` of the trace's rate form."""
    if share <= 0:
        return np.empty(0)
    cum = np.concatenate([[0.0], np.cumsum(trace.rates * share * trace.step_s)])  # requests by step edge
    total = cum[-1]
    n = int(total / batch * 1.2) + 10
    points = np.cumsum(rng.gamma(batch, 1.0, size=n))
    while points[-1] < total:
        points = np.concatenate([points, points[-1] + np.cumsum(rng.gamma(batch, 1.0, size=n))])
    points = points[points < total]
    edges = np.arange(len(trace.rates) + 1) * trace.step_s
    return np.interp(points, cum, edges)
