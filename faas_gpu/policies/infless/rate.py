"""The arrival rate INFless scales on, as the provider measures it (§3.2's R).

INFless's dispatcher acts on a function's request rate. The provider counts arrivals and, once
per control period, turns the running count into a rate: the larger of the average over a
stable window (`window_s`, 5 s) and over the last `panic_s` (1 s; Knative's panic window), so a
step of load is answered with instances sized for the step, not for the first sliver of it that
a slow average lets through, and a dip does not release instances at once.

`RateWindow` is that measurement as a pure object: the provider (`provider.scaling.infless`)
and the simulator (`faas_gpu.sim.infless`) both build it with `rate_window` and feed it
(time, arrivals so far), so the simulator scales on what the daemon would have measured rather
than on the true rate of the step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 5.0
PANIC_WINDOW_S = 1.0


@dataclass
class RateWindow:
    """Arrival samples (time, arrivals counted so far) over the last `window_s`; `observe` adds one
    and answers the rate. A rate needs two samples: the first observation answers 0."""

    window_s: float = WINDOW_S
    panic_s: float = PANIC_WINDOW_S
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))

    def observe(self, now: float, arrivals: float) -> float:
        """Requests per second: max(the window's average, the last `panic_s`'s)."""
        samples = self.samples
        samples.append((now, arrivals))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        (t0, n0), (t1, n1) = samples[0], samples[-1]
        stable = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        recent = next((s for s in reversed(samples) if t1 - s[0] >= self.panic_s), None)
        panic = (n1 - recent[1]) / (t1 - recent[0]) if recent is not None and t1 > recent[0] else 0.0
        return max(stable, panic)


def rate_window(window_s: float = WINDOW_S) -> RateWindow:
    """A function's rate measurement, as the provider and the simulator build it."""
    return RateWindow(window_s, PANIC_WINDOW_S)
