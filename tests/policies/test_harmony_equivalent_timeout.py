"""Eq. 5: the equivalent batching timeout of a group, and its iteration over more than two apps."""

import math

import numpy as np
import pytest

from faas_gpu.policies.harmony import equivalent_timeout, expected_batch


def eq12_integral(t1, r1, t2, r2, steps=200_000):
    """Appendix A, Eq. 12, by the midpoint rule: E[wait] with App2 first and App1 arriving at t."""
    eta1, eta2 = r1 / (r1 + r2), r2 / (r1 + r2)
    dt = (t2 - t1) / steps
    ts = (np.arange(steps) + 0.5) * dt
    f = r1 * np.exp(-r1 * ts)
    inner = float(np.sum(f * (ts + t1)) * dt) + t2 * (1 - float(np.sum(f) * dt))
    return eta1 * t1 + eta2 * inner


@pytest.mark.parametrize("t1,r1,t2,r2", [(0.1, 5, 0.4, 10), (0.454, 10, 0.654, 20), (0.0, 3, 1.0, 0.5)])
def test_two_apps_match_the_appendix_integral(t1, r1, t2, r2):
    assert equivalent_timeout([t1, t2], [r1, r2]) == pytest.approx(eq12_integral(t1, r1, t2, r2), rel=1e-6)
    # the order the apps are given in does not matter
    assert equivalent_timeout([t2, t1], [r2, r1]) == equivalent_timeout([t1, t2], [r1, r2])


def test_two_apps_match_the_buffer_it_models():
    """Monte Carlo of the buffer of §III-B: the first request's wait until the earliest deadline."""
    rng = np.random.default_rng(7)
    t1, r1, t2, r2 = 0.2, 4.0, 0.6, 6.0
    n = 200_000
    first_is_2 = rng.random(n) < r2 / (r1 + r2)
    arrival_1 = rng.exponential(1 / r1, n)  # next App1 request after the first (memoryless)
    wait = np.where(first_is_2, np.minimum(t2, arrival_1 + t1), t1)
    assert equivalent_timeout([t1, t2], [r1, r2]) == pytest.approx(wait.mean(), abs=3e-3)


def test_more_apps_fold_pairwise_in_timeout_order():
    ts, rs = [0.5, 0.1, 0.3], [2.0, 5.0, 1.0]
    t12 = equivalent_timeout([0.1, 0.3], [5.0, 1.0])
    assert t12 == pytest.approx(0.1 + (1 / 6) * (1 - math.exp(-5 * 0.2)) / 5)
    expected = equivalent_timeout([t12, 0.5], [6.0, 2.0])
    assert equivalent_timeout(ts, rs) == pytest.approx(expected)
    # a folded pair never waits longer than its larger timeout, so the order is kept
    assert 0.1 <= t12 <= 0.3


def test_equal_timeouts_give_that_timeout_and_one_app_its_own():
    assert equivalent_timeout([0.3, 0.3, 0.3], [1.0, 2.0, 3.0]) == pytest.approx(0.3)
    assert equivalent_timeout([0.42], [9.0]) == 0.42


def test_shifting_every_timeout_shifts_the_result():
    """What the planner relies on: T(s - L) = T(s) - L, so T is computed once per group."""
    slos, rates = [0.4, 0.7, 1.1, 0.9], [3.0, 8.0, 1.5, 12.0]
    base = equivalent_timeout(slos, rates)
    for lat in (0.05, 0.2, 0.39):
        assert equivalent_timeout([s - lat for s in slos], rates) == pytest.approx(base - lat, abs=1e-12)


def test_the_reference_codes_formula_is_a_different_one():
    t = equivalent_timeout([0.4545, 0.6545], [10.0, 20.0], formula="reference")
    assert t == pytest.approx(0.4545 + (20 / 30) * math.exp(-10 * 0.6545 - 0.4545))
    assert t < equivalent_timeout([0.4545, 0.6545], [10.0, 20.0])
    with pytest.raises(ValueError):
        equivalent_timeout([0.1], [1.0], formula="nope")


def test_expected_batch_is_constraint_9():
    assert expected_batch(13, 30.0, 0.4546) == 13  # floor(13.6) + 1 = 14, capped at b
    assert expected_batch(16, 30.0, 0.4546) == 14
    assert expected_batch(4, 5.0, 0.0) == 1
    assert expected_batch(1, 100.0, 1.0) == 1
