"""Waiting in tests for what another thread or process does in the background."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], object], timeout_s: float = 120.0, every_s: float = 0.05) -> bool:
    """True as soon as `check()` is, False when `timeout_s` passed without it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every_s)
    return False
