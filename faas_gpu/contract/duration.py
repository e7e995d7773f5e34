"""The one duration parser: Go's `time.ParseDuration` forms, as OpenFaaS reads its timeouts.

Why one: the provider (its flags, `read_timeout` and friends in a deploy), the CLI (`logs --since`)
and deploy-time validation read the same strings; three parsers meant a value one accepted and
another refused. The template's watchdog (`templates/python3-gpu/faas_gpu_watchdog/durations.py`) runs in images
without faas-gpu installed, so it keeps a copy of the grammar; `tests/contract/test_contract.py` checks the
two agree.

Grammar: a bare number is seconds ("30", "1.5"); otherwise one or more number+unit pairs with
units ns, us (µs), ms, s, m, h, where a number may be "1", "1.5", "1." or ".5" ("1h30m", "250ms").
"""

from __future__ import annotations

import re

_BARE = re.compile(r"\d+(\.\d+)?")
_PAIR = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_S = (2**63 - 1) / 1e9
"""Go's largest `time.Duration` (2562047h47m16.854775807s): `time.ParseDuration` refuses a longer
one, so OpenFaaS never runs with it; here it would overflow a socket's or a poll's timeout in the
replica (`exec_timeout: 99999999999h` was accepted at deploy, then every call failed)."""


def parse_duration(value: str | int | float, field_name: str = "duration") -> float:
    """Seconds from an int or float (seconds) or a Go duration ("10s", "1m30s", "500ms");
    ValueError naming `field_name` for anything else."""
    if isinstance(value, int | float):
        total = float(value)
    else:
        text = str(value).strip()
        if _BARE.fullmatch(text):
            total = float(text)
        else:
            pos, total = 0, 0.0
            for m in _PAIR.finditer(text):
                if m.start() != pos:
                    break
                total += float(m.group(1)) * UNIT_S[m.group(2)]
                pos = m.end()
            if not text or pos != len(text):
                raise ValueError(f"{field_name}: {str(value)[:80]!r} is not a duration (e.g. 10s, 1m30s, 500ms)")
    if not 0 <= total <= MAX_S:  # NaN too
        raise ValueError(f"{field_name}: {str(value)[:80]!r} is not a duration from 0 to Go's largest, 2562047h")
    return total
