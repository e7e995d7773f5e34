"""A request's class and SLO, parsed here and nowhere else.

What an SLO means on the wire: a *budget in milliseconds*, never a clock time (processes do not
share a clock). The caller's `X-Faas-Gpu-Slo-Ms` is counted from the request's arrival at the
instance; the instance sends the scheduler what is left of it on each attempt (`Budget`, as
`X-Faas-Gpu-Deadline-Ms`, so a retry is not given its whole SLO again); the scheduler converts
that budget to an absolute deadline exactly once, when it admits the job (`Job.deadline`).

Who parses: the gateway parses both headers before it forwards a call (a bad one is answered 400
with the messages below) and forwards its result in canonical form (`RequestSlo.forwarded`), the
instance's `index.py` reads that for its batch queue, the scheduler
reads the class and the budget, and the PROTEAN policies (`classify`) apply a function's defaults.
All of them call these functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from .headers import BUDGET_MS, CLASS, SLO_MS

MAX_SLO_MS = 3_600_000.0
"""The largest SLO anything accepts (one hour): longer than any watchdog timeout, so a larger one
is a mistake, and a bound keeps deadlines (arrival + SLO) ordinary finite times."""


class RequestClass(StrEnum):
    STRICT = "strict"
    BEST_EFFORT = "best-effort"


def parse_class(value: str | None) -> RequestClass | None:
    """`X-Faas-Gpu-Class` → the class; None when the header is absent or empty (the function's default applies)."""
    if value is None or not value.strip():
        return None
    v = value.strip().lower()
    for c in RequestClass:
        if v == c.value:
            return c
    raise ValueError(f"{CLASS}: expected 'strict' or 'best-effort', got {value.strip()[:40]!r}")


def parse_slo_ms(value: str | None) -> float | None:
    """`X-Faas-Gpu-Slo-Ms` → milliseconds (> 0, at most MAX_SLO_MS); None when absent or empty."""
    if value is None or not value.strip():
        return None
    problem = f"{SLO_MS}: expected a positive number of milliseconds up to {MAX_SLO_MS:.0f}, got {value.strip()[:40]!r}"
    try:
        ms = float(value.strip())
    except ValueError:
        raise ValueError(problem) from None
    if not math.isfinite(ms) or ms <= 0 or ms > MAX_SLO_MS:
        raise ValueError(problem)
    return ms


def parse_budget_ms(value: str | None) -> float | None:
    """`X-Faas-Gpu-Deadline-Ms` → the budget left in milliseconds (None: no deadline). Zero or less
    is a budget already spent (a miss at once), not an error; ValueError names the header."""
    if value is None or not value.strip():
        return None
    try:
        ms = float(value.strip())
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms):
        raise ValueError(f"{BUDGET_MS}: expected a number of milliseconds, got {value.strip()[:40]!r}")
    return ms


@dataclass(frozen=True)
class RequestSlo:
    """What a request asked for: its class and SLO (each None when it did not say)."""

    request_class: RequestClass | None = None
    slo_ms: float | None = None

    def forwarded(self, headers: Mapping[str, str]) -> dict[str, str]:
        """`headers` with the class and SLO as parsed here, written canonically (`strict`, `250`),
        and an empty one dropped: what the gateway forwards, so the instance behind it reads the
        gateway's result rather than the caller's spelling."""
        out = {k: v for k, v in headers.items() if k not in (CLASS, SLO_MS)}
        if self.request_class is not None:
            out[CLASS] = self.request_class.value
        if self.slo_ms is not None:
            out[SLO_MS] = format(self.slo_ms, ".15g")
        return out


def parse_request(headers: Mapping[str, str]) -> RequestSlo:
    """The class and SLO headers of a request; ValueError (the message names the header) for a bad one.

    `headers`: a case-insensitive mapping, or one with canonical names (`X-Faas-Gpu-Class`), as
    the gateway's WSGI headers are."""
    return RequestSlo(parse_class(headers.get(CLASS)), parse_slo_ms(headers.get(SLO_MS)))


def read_request(headers: Mapping[str, str]) -> RequestSlo:
    """`parse_request` for a reader behind the gateway (the instance): the gateway has answered
    400 to a bad header, so one that reaches it anyway (a direct call) counts as absent."""
    out = []
    for name, parse in ((CLASS, parse_class), (SLO_MS, parse_slo_ms)):
        try:
            out.append(parse(headers.get(name)))
        except ValueError:
            out.append(None)
    return RequestSlo(*out)


@dataclass(frozen=True)
class Budget:
    """An SLO being spent: `ms` granted at `start` (a `time.monotonic()` of the process holding it).

    The instance keeps one per batch and sends `remaining_ms` on each attempt; it never becomes a
    clock time on the wire."""

    ms: float
    start: float

    def remaining_ms(self, now: float) -> float:
        return max(0.0, self.ms - (now - self.start) * 1000)

    def header(self, now: float) -> str:
        """The value of `X-Faas-Gpu-Deadline-Ms` sent at `now`."""
        return f"{self.remaining_ms(now):.3f}"
