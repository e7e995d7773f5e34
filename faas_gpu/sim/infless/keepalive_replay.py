"""Keep-alive policies replayed on invocation traces at minute granularity (Fig. 16).

The method is the Azure study's (Shahrad et al., ATC '20), which INFless's Fig. 16 follows: one
instance per function, seen a minute at a time. A minute with invocations is a cold start when
the instance was not kept or pre-warmed for it, and the minute's other invocations are warm
whatever their number, so a burst of 10^6 requests in one minute is one cold start (`ASSUMED`,
printed with the figures). Two rates follow from it: per invocation (`cold_rate`, the paper's;
a trace with bursts weighs little) and per active minute (`cold_rate_active`, which a burst does
not dilute). Idle waste is counted up to the trace's end: what a policy would keep loaded after
the last recorded minute is no waste the trace can show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from faas_gpu.policies.infless import KeepAlivePolicy
from faas_gpu.policies.infless.keepalive import MINUTE, warm

ASSUMED = (
    "keep-alive replay (the Azure study's method): one instance per function, a minute at a time; a minute with "
    "invocations is one cold start when the instance was not kept warm for it, however many invocations it has "
    "(a burst of 10^6 in one minute is one cold start); idle waste counted up to the trace's end"
)


@dataclass
class KeepAliveStats:
    invocations: int
    active_minutes: int
    cold_starts: int
    wasted_minutes: float  # minutes an instance was loaded but idle, within the trace
    minutes: int = 0  # the trace's length
    cold_minutes: list[int] = field(default_factory=list)  # the active minutes that were cold starts

    @property
    def cold_rate(self) -> float:
        """Cold starts per invocation (Fig. 16's rate)."""
        return self.cold_starts / self.invocations if self.invocations else 0.0

    @property
    def cold_rate_active(self) -> float:
        """Cold starts per minute with invocations: a burst counts once, as the replay sees it."""
        return self.cold_starts / self.active_minutes if self.active_minutes else 0.0


def replay_keepalive(counts: Sequence[float], policy: KeepAlivePolicy) -> KeepAliveStats:
    """Minute-granularity replay (the Azure study's method). After active minute t the policy's
    windows (p, k) say the instance is loaded over [t + p, t + p + k] (from t itself when p = 0);
    the next active minute n is a cold start outside that span, and the loaded time between the end
    of minute t and the start of minute n (or the span's end, or the trace's) is idle waste."""
    end = len(counts)
    minutes = [m for m, c in enumerate(counts) if c > 0]
    cold = minutes[:1]
    waste = 0.0
    for k, t in enumerate(minutes):
        w = policy.windows(minutes, t)  # the policies read only the minutes up to t
        a = t + w.prewarm_s / MINUTE
        b = min(a + w.keepalive_s / MINUTE, end)
        nxt = minutes[k + 1] if k + 1 < len(minutes) else None
        if nxt is None:
            waste += max(0.0, b - max(a, t + 1))
            continue
        if not warm(w, (nxt - t) * MINUTE):  # the provider's rule: outside [a, b]
            cold.append(nxt)
        waste += max(0.0, min(b, nxt) - max(a, t + 1))
    return KeepAliveStats(int(sum(counts)), len(minutes), len(cold), waste, end, cold)
