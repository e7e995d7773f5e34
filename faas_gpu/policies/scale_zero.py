"""Scale to zero and back: when an idle function may go to zero, and what a call at zero asks for.

OpenFaaS Pro's autoscaler (faas-idler before it) scales a function labelled
`com.openfaas.scale.zero: "true"` to zero once no call has reached it for
`com.openfaas.scale.zero-duration` (a Go duration, 15m by default), and the gateway scales it back
to its minimum (`com.openfaas.scale.min`, at least 1) when a call arrives, holding the call until a
replica is ready. INFless's LSTH (`keepalive`) says the same for a profiled model function, with a
pre-warm window on top.

Two rules hold whatever policy scales the function, and are written once here:
- `idle`: the function had no call for `zero_after_s` and none is in flight;
- `holds`: a call in flight is demand. A call waiting at the gateway for a replica (the call that
  woke the function) counts like one being served: while any is, the function keeps at least one
  instance, and an instance that is still starting is not released (`releasable`). Counting only
  the calls answered, as the keep-alive step once did, released the instance a wake-up had just
  started, and the waiting call got a 503 after a minute.

Pure: the time since the last call and the calls in flight come in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ZERO_AFTER_S = 15 * 60.0
"""OpenFaaS Pro's default `com.openfaas.scale.zero-duration`."""


@dataclass(frozen=True)
class ScaleToZero:
    """OpenFaaS Pro's rule for one function: to zero after `zero_after_s` without a call."""

    zero_after_s: float = DEFAULT_ZERO_AFTER_S

    def idle(self, since_call_s: float, in_flight: int) -> bool:
        """Whether the function may go to zero now: `since_call_s` since a call last arrived or
        was in flight (since its deploy when none has), and none in flight now."""
        return in_flight <= 0 and since_call_s >= self.zero_after_s


def holds(in_flight: int) -> int:
    """The fewest instances a function keeps with `in_flight` calls at the gateway (waiting for a
    replica or being served): one while there is any, so no decision takes it to zero under them."""
    return 1 if in_flight > 0 else 0


def releasable(ready: bool, age_s: float, min_age_s: float, in_flight: int) -> bool:
    """Whether an instance may be released: it has served `min_age_s` (no flapping) and, while
    calls are in flight, it is ready (one still starting was started for calls that wait for it)."""
    return age_s >= min_age_s and (ready or in_flight <= 0)


def wake_to(min_replicas: int) -> int:
    """How many replicas a call at zero starts: the function's minimum, at least one (the gateway's
    `scale_from_zero` with a `com.openfaas.scale.min` of 0 or unset starts one)."""
    return max(1, min_replicas)
