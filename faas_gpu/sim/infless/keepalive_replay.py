"""Keep-alive policies replayed on invocation traces at minute granularity (Fig. 16)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from faas_gpu.policies.infless import KeepAlivePolicy
from faas_gpu.policies.infless.keepalive import MINUTE, warm


@dataclass
class KeepAliveStats:
    invocations: int
    active_minutes: int
    cold_starts: int
    wasted_minutes: float  # minutes an instance was loaded but idle

    @property
    def cold_rate(self) -> float:
        return self.cold_starts / self.invocations if self.invocations else 0.0


def replay_keepalive(counts: Sequence[int], policy: KeepAlivePolicy) -> KeepAliveStats:
    """Minute-granularity replay (the Azure study's method). After active minute t the policy's
    windows (p, k) say the instance is loaded over [t + p, t + p + k] (from t itself when p = 0);
    the next active minute n is a cold start outside that span, and the loaded time between the end
    of minute t and the start of minute n (or the span's end) is idle waste."""
    minutes = [m for m, c in enumerate(counts) if c > 0]
    cold = 1 if minutes else 0
    waste = 0.0
    for k, t in enumerate(minutes):
        w = policy.windows(minutes, t)  # the policies read only the minutes up to t
        a = t + w.prewarm_s / MINUTE
        b = a + w.keepalive_s / MINUTE
        nxt = minutes[k + 1] if k + 1 < len(minutes) else None
        if nxt is None:
            waste += max(0.0, b - max(a, t + 1))
            continue
        if not warm(w, (nxt - t) * MINUTE):  # the provider's rule: outside [a, b]
            cold += 1
        waste += max(0.0, min(b, nxt) - max(a, t + 1))
    return KeepAliveStats(int(sum(counts)), len(minutes), cold, waste)
