"""Durations as the watchdogs read them: an int means seconds, else a Go duration (10s, 1m30s,
500ms); and the timeout of one request (exec_timeout, shortened by an `X-Timeout` header)."""

from __future__ import annotations

import re

# faas_gpu.contract.duration's grammar, copied: the watchdog runs in images without faas-gpu
# (tests/contract/test_contract.py checks that the two agree)
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_S = (2**63 - 1) / 1e9  # Go's largest time.Duration: ParseDuration refuses a longer one
MAX_WAIT_S = (2**31 - 1) // 1000
"""The longest wait the watchdog hands to a poll (its timeout is an int of milliseconds): a longer
duration (24.8 days) waits this long instead of failing every call with an OverflowError."""


def parse_duration(value: str, name: str) -> float:
    """An int means seconds; else a Go duration such as 10s, 1m30s, 500ms."""
    text = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        total = float(text)
    else:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise SystemExit(f"fwatchdog: {name}={value[:80]!r} is not a duration (e.g. 10s, 1m30s, 500ms)")
        total = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not 0 <= total <= MAX_S:
        raise SystemExit(f"fwatchdog: {name}={value[:80]!r} is not a duration from 0 to Go's largest, 2562047h")
    return total


def request_timeout(exec_timeout: float, asked: str | None) -> float:
    """exec_timeout, or the caller's `X-Timeout` where it is shorter (or exec_timeout is off);
    0 means none. A header that is not a duration is ignored."""
    limit = exec_timeout
    if asked:
        try:
            shorter = parse_duration(asked, "X-Timeout")
            if 0 < shorter < limit or limit <= 0:
                limit = shorter
        except SystemExit:
            pass
    return min(limit, MAX_WAIT_S)
