"""Scale to zero and back as pure rules (issue 46): OpenFaaS Pro's idle rule, a call in flight as
demand, and the keep-alive window counted from the last call itself."""

from __future__ import annotations

import pytest

from faas_gpu.policies.infless.keepalive import FixedKeepAlive, LongShortTermHistogram, Windows, warm
from faas_gpu.policies.scale_zero import DEFAULT_ZERO_AFTER_S, ScaleToZero, holds, releasable, wake_to


def test_a_function_goes_to_zero_only_after_its_zero_duration_without_a_call():
    rule = ScaleToZero(20.0)
    assert not rule.idle(19.9, in_flight=0)
    assert rule.idle(20.0, in_flight=0)
    assert ScaleToZero().zero_after_s == DEFAULT_ZERO_AFTER_S == 900.0  # OpenFaaS Pro's 15m


def test_a_call_in_flight_is_demand_however_long_the_function_was_idle():
    """The call that wakes a function waits at the gateway: it is in flight, not yet answered."""
    assert not ScaleToZero(20.0).idle(3600.0, in_flight=1)
    assert holds(1) == 1 and holds(5) == 1 and holds(0) == 0


def test_an_instance_still_starting_is_not_released_under_calls_waiting_for_it():
    assert not releasable(ready=False, age_s=30.0, min_age_s=10.0, in_flight=1)
    assert releasable(ready=True, age_s=30.0, min_age_s=10.0, in_flight=1)
    assert releasable(ready=False, age_s=30.0, min_age_s=10.0, in_flight=0)  # a stuck start, no caller
    assert not releasable(ready=True, age_s=5.0, min_age_s=10.0, in_flight=0)  # no flapping


@pytest.mark.parametrize(("lo", "n"), [(0, 1), (1, 1), (3, 3)])
def test_a_call_at_zero_wakes_the_minimum_and_at_least_one(lo, n):
    assert wake_to(lo) == n


def test_the_keep_alive_window_counts_from_the_call_not_from_its_minute():
    """Issue 46: a call at 0:45 with a 20 s keep-alive was unloaded at once (45 s > 20 s since its
    minute began); its window ends 20 s after the call."""
    w = FixedKeepAlive(20.0).windows([0], 0)
    assert w == Windows(0.0, 20.0)
    assert not warm(w, 50.0)  # the minute-only rule: unloaded 5 s after the call
    assert warm(w, 50.0, since_call_s=5.0)
    assert not warm(w, 70.0, since_call_s=25.0)


def test_calls_in_flight_keep_a_function_warm_whatever_its_windows():
    w = LongShortTermHistogram().windows(list(range(0, 24 * 60, 10)), 24 * 60)
    assert w.prewarm_s > 0  # a gap: between calls LSTH unloads the function
    assert not warm(w, 5 * 60.0, since_call_s=5 * 60.0)
    assert warm(w, 5 * 60.0, since_call_s=5 * 60.0, in_flight=1)
