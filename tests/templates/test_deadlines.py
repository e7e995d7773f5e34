"""The watchdog's exec-timeout timer (faas_gpu_watchdog/deadlines.py), in this process."""

from __future__ import annotations

import threading
import time

from faas_gpu.paths import TEMPLATES_DIR
from tests.module_files import load


def _deadlines():
    path = TEMPLATES_DIR / "python3-gpu" / "faas_gpu_watchdog" / "deadlines.py"
    return load("fwatchdog_deadlines_copy", path).Deadlines()


def test_due_calls_fire_in_deadline_order_and_cancelled_ones_never():
    timer = _deadlines()
    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()

    def fire(name: str):
        def go() -> None:
            fired.append(name)
            if name == "last":
                done.set()

        return go

    timer.add(now + 0.30, fire("last"))
    timer.add(now + 0.10, fire("second"))
    cancelled = timer.add(now + 0.05, fire("cancelled"))
    timer.add(now + 0.02, fire("first"))  # a new earliest deadline wakes the timer
    timer.cancel(cancelled)
    timer.cancel(cancelled)  # twice is harmless
    assert done.wait(5)
    time.sleep(0.05)
    assert fired == ["first", "second", "last"]
    assert len(timer) == 0


def test_calls_that_end_in_time_do_not_pile_up():
    timer = _deadlines()
    far = time.monotonic() + 3600
    for _ in range(5000):
        timer.cancel(timer.add(far, lambda: None))
    kept = timer.add(far, lambda: None)
    assert len(timer) == 1 and len(timer._heap) < 2100  # compacted, not 5,001 entries
    timer.cancel(kept)


def test_a_request_waits_no_longer_than_a_poll_can():
    """`exec_timeout: 2000000h` (Go's durations reach 2562047h) overflowed the watchdog's poll on
    every call: a wait is at most the poll's longest (24.8 days)."""
    durations = load("fwatchdog_durations_cap", TEMPLATES_DIR / "python3-gpu" / "faas_gpu_watchdog" / "durations.py")
    assert durations.request_timeout(2_000_000 * 3600.0, None) == durations.MAX_WAIT_S
    assert durations.request_timeout(30.0, "2000000h") == 30.0
