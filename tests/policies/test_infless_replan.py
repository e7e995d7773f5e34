"""The stability rules around INFless's re-planning: when a restart pays, which batches the
arrivals fill within their timeout, and corrections fading back to 1 (run 7 of the path-limit
section in EXPERIMENTS)."""

import pytest

from faas_gpu.policies.infless import (
    Candidate,
    PathCost,
    bounds,
    decayed,
    fills,
    restart_pays,
    underfilled,
    with_path,
)

# the classify model's own times (ms) and run 7's fitted path: 1.76 ms a batch + 1.90 ms a request
MODEL_MS = {1: 1.1, 8: 3.3, 16: 6.5, 32: 13.0}
RUN7 = PathCost(fixed_s=0.00176, per_item_s=0.00190)


def cand(b):
    return with_path(Candidate(b, 1, 0, MODEL_MS[b] / 1000), RUN7)


def test_a_running_plan_that_meets_the_demand_is_never_restarted():
    assert not restart_pays(400, None, 2000, 300)  # predicted 400 for 300 asked: not short
    assert not restart_pays(400, 390, 2000, 400)  # observed within 20% of the demand


def test_a_small_predicted_gain_does_not_pay_for_a_restart():
    """Run 7: batch 8 predicted 392, observed 210 under 32 callers (demand 1.25 x 392); batch 32
    predicted 416. Scaled by batch 8's own accuracy (210 / 392) it promises 223: 6% more, not 25%."""
    assert not restart_pays(392, 210, 416, 1.25 * 392)


def test_a_large_gain_for_a_clearly_short_plan_pays():
    """Batch 1 predicted 185 and observed 150 under a queue; batch 8 predicted 390 (x 150/185 = 316)."""
    assert restart_pays(185, 150, 390, 1.25 * 185)
    assert restart_pays(0, None, 100, 50)  # nothing serves: nothing to lose


def test_the_gain_is_weighed_against_the_observed_capacity_not_the_prediction():
    # the new plan promises 1.3x the running plan's prediction; the running plan served its prediction
    assert restart_pays(200, 200, 260, 300)
    # a running plan that served more than predicted: the new plan's prediction is not scaled up
    assert not restart_pays(200, 240, 280, 400)


@pytest.mark.parametrize("margin", [0.1, 0.2, 0.3])
def test_the_shortfall_margin_is_a_parameter(margin):
    assert restart_pays(100, None, 200, 100 / (1 - margin) + 1, short_margin=margin)
    assert not restart_pays(100, None, 200, 100 / (1 - margin) - 1, short_margin=margin)


def test_210_rps_fill_batch_8_and_16_but_not_32_within_their_timeouts():
    """Run 7's replies at batch 32: mean batch 20.1 at ~210 rps. Batch 32's slack (250 ms less
    t_exec less the path's margin) is ~112 ms: 210 rps bring ~23 requests in it."""
    slo = 0.25
    assert fills(cand(8), slo, 210)
    assert fills(cand(16), slo, 210)
    assert not fills(cand(32), slo, 210)
    b32 = cand(32)
    assert fills(b32, slo, bounds(b32.t_exec_s, slo, 32, b32.path_s).r_low)
    assert fills(cand(1), slo, 0.0)  # batch 1 never waits


def test_a_batch_slower_than_the_slo_never_fills():
    assert not fills(Candidate(8, 1, 0, 0.3), 0.25, 1e6)


def test_a_plan_is_underfilled_below_the_sum_of_its_lower_bounds_and_never_when_idle():
    """Run 28: one batch-4 instance (a 236 ms timeout: r_low = ceil(1 / 0.236) x 4 = 20 rps) and
    one caller waiting out that timeout on every call, 4 rps."""
    assert bounds(0.0124, 0.25, 4).r_low == 20.0  # Eq. 1 with that slack
    assert underfilled(4.0, [20.0])
    assert not underfilled(20.0, [20.0])
    assert underfilled(30.0, [20.0, 16.0])  # each alone would fill; the plan as a whole does not
    assert not underfilled(4.0, [0.0])  # batch 1 never waits for a batch
    assert not underfilled(0.0, [20.0])  # no arrivals: keep-alive's to judge, not the batch's


def test_corrections_fade_halfway_to_1_a_step_and_stop_at_1():
    assert decayed(4.0) == pytest.approx(2.5)
    assert decayed(decayed(4.0)) == pytest.approx(1.75)
    assert decayed(1.01) == 1.0
    assert decayed(0.5) == 1.0
    f = 4.0
    for _ in range(12):
        f = decayed(f)
    assert f == 1.0
    assert decayed(3.0, decay=0.0) == 1.0
