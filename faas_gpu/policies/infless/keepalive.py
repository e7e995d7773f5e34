"""When to pre-warm an idle function and how long to keep it warm (INFless §3.5).

Invocations are seen at minute granularity, as in the Azure study that introduced the hybrid
histogram policy: the history is the sorted list of minutes in which the function was called,
and an idle time is the distance between two such minutes. After an invocation at minute t a
policy's `Windows` say: unload now and load again at t + prewarm (0: stay loaded), then keep
the instance warm for `keepalive` more seconds.

- `LongShortTermHistogram` (LSTH): idle times of the last 24 h and of the last 1 h; head (5th
  percentile) and tail (99th) of each; pre-warm = g*L_head + (1-g)*S_head and keep-alive end =
  g*L_tail + (1-g)*S_tail, g = 0.5.
  A histogram with fewer than `min_samples` idle times is not trusted (HHP's own rule): the
  other window stands in for it (`min_samples=0` is §3.5 to the letter, which lets one or two
  idle times of a quiet hour set the pre-warm window and costs cold starts on sparse traces).
- `HybridHistogram` (HHP, Shahrad et al., ATC '20): one histogram of all idle times up to a
  4 h range; when it is not representative (too few idle times, a flat histogram, or too many
  idle times beyond the range) it falls back to the conservative default: stay warm for the
  whole range. `window_min=240` is HHP as INFless describes its baseline ("tracks the idle times
  of a configurable duration (e.g., 4 hours)"): only the idle times of the last 4 hours.
- `FixedKeepAlive`: OpenFaaS-style fixed window (300 s in the paper's baselines).
Both histogram policies use HHP's 10% margins (pre-warm earlier, keep alive longer).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from faas_gpu.contract.duration import parse_duration

MINUTE = 60.0


@dataclass(frozen=True)
class Windows:
    prewarm_s: float
    keepalive_s: float


class KeepAlivePolicy(Protocol):
    name: str

    def windows(self, active_minutes: Sequence[int], now_minute: int) -> Windows: ...


def idle_times(active_minutes: Sequence[int], since_minute: int, until_minute: int) -> list[int]:
    """Idle times (minutes) that ended within [since, until]; `active_minutes` is sorted."""
    lo = bisect.bisect_left(active_minutes, since_minute)
    hi = bisect.bisect_right(active_minutes, until_minute)
    start = max(lo, 1)
    return [active_minutes[i] - active_minutes[i - 1] for i in range(start, hi)]


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: the histogram bin where the cumulative count reaches pct."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def _windows(head_min: float, tail_min: float, margin: float) -> Windows:
    prewarm = math.floor(head_min * (1 - margin))
    end = math.ceil(tail_min * (1 + margin))
    return Windows(prewarm * MINUTE, max(1, end - prewarm) * MINUTE)


def warm(w: Windows, since_s: float, *, since_call_s: float | None = None, in_flight: int = 0) -> bool:
    """The keep-alive rule the provider applies and the simulator replays: an idle function is
    kept (or pre-warmed) while inside [prewarm, prewarm + keep-alive] seconds after its last
    active minute began; with no pre-warm gap it stays warm from the start, and the minute of
    the invocation itself is always warm. `since_s`: seconds since the last active minute began.

    Where the last call's own time is known (`since_call_s`), the window ends prewarm + keep-alive
    after that call, not after the start of its minute: a call at 0:45 with a 20 s keep-alive is
    kept until 1:05, not unloaded at once. A function with calls in flight (`in_flight`: being
    served, or waiting at the gateway for the instance a wake-up started) is always warm: those
    calls are demand, whatever the windows say (`faas_gpu.policies.scale_zero.holds`)."""
    if in_flight > 0:
        return True
    last = since_s if since_call_s is None else min(since_s, since_call_s)
    in_window = last <= w.prewarm_s + w.keepalive_s
    return in_window and (w.prewarm_s == 0 or since_s < MINUTE or since_s >= w.prewarm_s)


@dataclass(frozen=True)
class FixedKeepAlive:
    keepalive_s: float = 300.0
    name: str = "fixed"

    def windows(self, active_minutes: Sequence[int], now_minute: int) -> Windows:
        return Windows(0.0, self.keepalive_s)


@dataclass(frozen=True)
class HybridHistogram:
    range_min: int = 240
    head_pct: float = 5.0
    tail_pct: float = 99.0
    margin: float = 0.10
    min_samples: int = 10
    cv_threshold: float = 2.0
    oob_threshold: float = 0.5
    window_min: int | None = None
    name: str = "hhp"

    def windows(self, active_minutes: Sequence[int], now_minute: int) -> Windows:
        since = -(2**62) if self.window_min is None else now_minute - self.window_min
        its = idle_times(active_minutes, since, now_minute)
        default = Windows(0.0, self.range_min * MINUTE)
        if len(its) < self.min_samples:
            return default
        in_range = sorted(i for i in its if i <= self.range_min)
        if len(in_range) < (1 - self.oob_threshold) * len(its) or not in_range:
            return default  # mostly beyond the range: HHP hands over to a time-series model
        counts: dict[int, int] = {}
        for i in in_range:
            counts[i] = counts.get(i, 0) + 1
        bins = [counts.get(b, 0) for b in range(1, self.range_min + 1)]
        mean = sum(bins) / len(bins)
        cv = math.sqrt(sum((c - mean) ** 2 for c in bins) / len(bins)) / mean
        if cv < self.cv_threshold:
            return default  # a flat histogram predicts nothing
        return _windows(percentile(in_range, self.head_pct), percentile(in_range, self.tail_pct), self.margin)


@dataclass(frozen=True)
class LongShortTermHistogram:
    long_min: int = 24 * 60
    short_min: int = 60
    gamma: float = 0.5
    head_pct: float = 5.0
    tail_pct: float = 99.0
    margin: float = 0.10
    default_keepalive_s: float = 600.0
    min_samples: int = 10
    name: str = "lsth"

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma: must be in [0, 1], got {self.gamma}")

    def windows(self, active_minutes: Sequence[int], now_minute: int) -> Windows:
        long_its = sorted(idle_times(active_minutes, now_minute - self.long_min, now_minute))
        short_its = sorted(idle_times(active_minutes, now_minute - self.short_min, now_minute))
        if len(short_its) < self.min_samples:
            short_its = long_its  # a quiet hour's few idle times say little
        if len(long_its) < self.min_samples and len(short_its) >= self.min_samples:
            long_its = short_its
        if not long_its or not short_its:
            return Windows(0.0, self.default_keepalive_s)
        g = self.gamma
        head = g * percentile(long_its, self.head_pct) + (1 - g) * percentile(short_its, self.head_pct)
        tail = g * percentile(long_its, self.tail_pct) + (1 - g) * percentile(short_its, self.tail_pct)
        return _windows(head, tail, self.margin)


def keepalive_policy(raw: str) -> KeepAlivePolicy:
    """The policy a function's `com.faas-gpu.keep-alive` names: `lsth` (the default), `hhp`, or a fixed
    window such as `300s` / `fixed:5m`. The provider's INFless scaling and `faas-gpu replay`'s
    simulator both build it here, so both run the same object. ValueError for anything else."""
    text = raw.strip().lower()
    if text == "lsth":
        return LongShortTermHistogram()
    if text == "hhp":
        return HybridHistogram()
    return FixedKeepAlive(parse_duration(text.removeprefix("fixed:"), "keep-alive"))
