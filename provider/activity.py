"""What the gateway saw of each function lately: its invocation rate and how many calls met their SLO.

Why apart from the Prometheus counters: the status page (`provider/ui/`) shows a rate and an SLO
attainment without a Prometheus to ask, and the counters hold neither the SLO of each call nor a
time window. Recording costs one lock and a deque append per call; each function keeps at most
`window_s` worth of timestamps (bounded by `max_events`), and the SLO tallies are two integers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Key = tuple[str, str]  # (namespace, name), as the Invoker keys functions


@dataclass
class _Seen:
    times: deque[float] = field(default_factory=deque)
    met: int = 0
    missed: int = 0


class Activity:
    """Per-function calls in the last `window_s` seconds, and SLO tallies since the gateway started.

    A call counts against its SLO when it had one (the caller's `X-Faas-Gpu-Slo-Ms`, else the
    function's `com.faas-gpu.slo-ms`): it *met* it when it was answered below 500 within the SLO as
    the gateway timed it, and *missed* it otherwise (a 504 for a deadline passed is a miss)."""

    def __init__(self, window_s: float = 60.0, max_events: int = 100_000, clock: Callable[[], float] = time.monotonic):
        self.window_s, self.max_events, self.clock = window_s, max_events, clock
        self._seen: dict[Key, _Seen] = {}
        self._lock = threading.Lock()

    def record(self, key: Key, status: int, seconds: float, slo_ms: float | None) -> None:
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                seen = self._seen[key] = _Seen()
            seen.times.append(now)
            self._trim(seen, now)
            if slo_ms is not None:
                if status < 500 and seconds * 1000 <= slo_ms:
                    seen.met += 1
                else:
                    seen.missed += 1

    def forget(self, key: Key) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def view(self, key: Key) -> dict:
        """`{ratePerSecond, slo: {met, missed}}` of one function (zeros when it had no call)."""
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                return {"ratePerSecond": 0.0, "slo": {"met": 0, "missed": 0}}
            self._trim(seen, now)
            return {
                "ratePerSecond": round(len(seen.times) / self.window_s, 3),
                "slo": {"met": seen.met, "missed": seen.missed},
            }

    def _trim(self, seen: _Seen, now: float) -> None:
        while seen.times and (now - seen.times[0] > self.window_s or len(seen.times) > self.max_events):
            seen.times.popleft()
