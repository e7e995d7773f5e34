"""The gateway's in-flight limits as numbers: the reserve, one function's share, max_inflight."""

from __future__ import annotations

import threading

import pytest

from provider.inflight import InflightLimiter, TooManyInFlight, max_inflight_of, reserve_for

A, B = ("ns", "a"), ("ns", "b")


def test_default_share_leaves_threads_for_other_functions_and_a_reserve_for_health():
    lim = InflightLimiter(64)
    assert reserve_for(64) == 8 and lim.total == 56 and lim.per_function == 32
    for _ in range(32):
        lim.enter(A, lim.limit(0, 1))
    with pytest.raises(TooManyInFlight, match="a.ns: 32 in flight"):
        lim.enter(A, lim.limit(0, 1))
    for _ in range(24):  # another function still gets threads ...
        lim.enter(B, lim.limit(0, 1))
    with pytest.raises(TooManyInFlight, match="at the gateway"):  # ... but never the reserve
        lim.enter(B, lim.limit(0, 1))
    lim.leave(A)
    lim.enter(B, lim.limit(0, 1))
    assert lim.in_flight(A) == 31 and lim.in_flight(B) == 25


def test_max_inflight_is_per_replica_and_never_above_the_share():
    lim = InflightLimiter(64)
    assert lim.limit(2, 3) == 6
    assert lim.limit(2, 0) == 2  # scaled to zero: one replica is starting
    assert lim.limit(100, 4) == 32


def test_a_raised_share_is_clamped_to_all_but_the_reserve():
    lim = InflightLimiter(64, per_function=1000)
    assert lim.per_function == lim.total == 56


def test_a_waiting_caller_gets_the_slot_another_gives_back():
    lim = InflightLimiter(16)
    lim.enter(A, 1)
    got = threading.Event()
    t = threading.Thread(target=lambda: (lim.enter(A, 1, wait=True), got.set()))
    t.start()
    assert not got.wait(0.2)
    lim.leave(A)
    assert got.wait(5)
    t.join()


@pytest.mark.parametrize("raw", ["lots", "-1", "1.5"])
def test_bad_max_inflight_names_the_field(raw):
    with pytest.raises(ValueError, match="envVars.max_inflight"):
        max_inflight_of({"max_inflight": raw})


def test_absent_or_zero_max_inflight_is_unlimited():
    assert max_inflight_of(None) == 0 and max_inflight_of({"max_inflight": "0"}) == 0
    assert max_inflight_of({"max_inflight": " 4 "}) == 4


def test_the_ready_replicas_share_refuses_at_once_or_waits_when_told_to():
    """max_inflight x ready replicas (`enter_replicas`): at once past it, as a watchdog refuses;
    a call that waited for a replica to start waits for a slot there instead (issue 42)."""
    lim = InflightLimiter(16)
    lim.enter_replicas(A, 1)
    with pytest.raises(TooManyInFlight, match="at its ready replicas"):
        lim.enter_replicas(A, 1)
    lim.enter_replicas(B, 1)  # another function's replicas are their own
    got = threading.Event()
    t = threading.Thread(target=lambda: (lim.enter_replicas(A, 1, wait_s=30), got.set()))
    t.start()
    assert not got.wait(0.2)
    lim.leave_replicas(A)
    assert got.wait(5)
    t.join()
