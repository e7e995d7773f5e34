"""In-flight limits: one slow function can never take every gateway thread.

The gateway serves from one gunicorn gthread worker with `threads` threads; a request to a slow
function holds its thread until the function answers, and once every thread is held gunicorn
stops accepting, so `/healthz` and `/system/*` would wait behind the slow function. Here each
invocation takes a slot before it is forwarded, and gets 429 at once when none is free:

- all functions together hold at most `threads - reserve` threads, so `reserve` threads are left
  for health checks, the control plane and metrics whatever the invocations do;
- one function holds at most `per_function` of them (default half the threads, so other
  functions still get threads while one is slow; `--max-inflight-per-function` raises it for a
  node that serves one function);
- a function whose deployment sets OpenFaaS's `max_inflight` env var (the watchdog's limit per
  replica; 0 or absent: unlimited) has at most `max_inflight` x its ready replicas *at its
  replicas*, so requests the replicas would refuse with 429 are refused at the gateway without
  holding a thread. That share is taken once the call has a ready replica to go to, not while it
  waits for one (issue 42): a call waiting for a replica that restarts, or for the first one of a
  function scaled to zero, is not refused for capacity that is on its way, and once one is ready
  it waits for a slot there for what is left of the ready timeout. A call that finds ready
  replicas full is refused at once, as their watchdogs would refuse it.

Queued (async) invocations do not hold gateway threads: they wait for a slot instead of 429.
"""

from __future__ import annotations

import threading
import time

MAX_INFLIGHT_ENV = "max_inflight"


def reserve_for(threads: int) -> int:
    """Threads kept from invocations for health and control-plane routes: an eighth, at least 2."""
    return max(2, threads // 8)


def max_inflight_of(env: dict[str, str] | None) -> int:
    """OpenFaaS's per-replica `max_inflight` (0: unlimited); ValueError names the field."""
    raw = (env or {}).get(MAX_INFLIGHT_ENV)
    if raw is None or not raw.strip():
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"envVars.{MAX_INFLIGHT_ENV}: must be a non-negative integer, got {raw[:40]!r}") from None
    if value < 0:
        raise ValueError(f"envVars.{MAX_INFLIGHT_ENV}: must be a non-negative integer, got {value}")
    return value


class TooManyInFlight(Exception):
    """No slot: the message says whose limit and how large it is (answered 429)."""


class InflightLimiter:
    def __init__(self, threads: int, per_function: int | None = None):
        self.total = max(1, threads - reserve_for(threads))
        self.per_function = max(1, min(self.total, per_function or threads // 2))
        self._cond = threading.Condition()
        self._all = 0
        self._by_fn: dict[tuple[str, str], int] = {}
        self._at_replicas: dict[tuple[str, str], int] = {}  # forwarded to a ready replica (max_inflight's share)

    def limit(self, max_inflight: int, replicas: int) -> int:
        """The function's slots: the default share, or fewer when its replicas take fewer."""
        if max_inflight > 0:
            return max(1, min(self.per_function, max_inflight * max(1, replicas)))
        return self.per_function

    def enter_replicas(self, key: tuple[str, str], limit: int, *, wait_s: float = 0.0) -> None:
        """A call forwarded to one of the function's ready replicas, which take `limit` at once
        (`limit`: max_inflight x ready replicas); TooManyInFlight past it, after waiting up to
        `wait_s` for a slot (0: at once, as a watchdog refuses)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._at_replicas.get(key, 0) >= limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TooManyInFlight(
                        f"Concurrent request limit exceeded for {key[1]}.{key[0]}: {limit} in flight at its ready "
                        "replicas (max_inflight)."
                    )
                self._cond.wait(min(1.0, left))
            self._at_replicas[key] = self._at_replicas.get(key, 0) + 1

    def leave_replicas(self, key: tuple[str, str]) -> None:
        with self._cond:
            n = self._at_replicas.get(key, 1) - 1
            if n > 0:
                self._at_replicas[key] = n
            else:
                self._at_replicas.pop(key, None)
            self._cond.notify_all()

    def _refusal(self, key: tuple[str, str], limit: int) -> str | None:
        if self._by_fn.get(key, 0) >= limit:
            return f"Concurrent request limit exceeded for {key[1]}.{key[0]}: {limit} in flight (max_inflight)."
        if self._all >= self.total:
            return f"Concurrent request limit exceeded at the gateway: {self.total} invocations in flight."
        return None

    def enter(self, key: tuple[str, str], limit: int, *, wait: bool = False) -> None:
        """Take a slot, or raise TooManyInFlight (`wait`: block until one is free instead)."""
        with self._cond:
            reason = self._refusal(key, limit)
            while reason is not None:
                if not wait:
                    raise TooManyInFlight(reason)
                self._cond.wait(1.0)
                reason = self._refusal(key, limit)
            self._all += 1
            self._by_fn[key] = self._by_fn.get(key, 0) + 1

    def leave(self, key: tuple[str, str]) -> None:
        with self._cond:
            self._all -= 1
            n = self._by_fn.get(key, 1) - 1
            if n > 0:
                self._by_fn[key] = n
            else:
                self._by_fn.pop(key, None)
            self._cond.notify_all()

    def in_flight(self, key: tuple[str, str]) -> int:
        return self._by_fn.get(key, 0)
