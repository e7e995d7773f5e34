"""INFless's capacity model with the serving path's cost, and its correction by what is observed."""

import pytest

from faas_gpu.policies.infless import (
    Candidate,
    PathCost,
    bounds,
    correction,
    demand,
    observed_capacity,
    schedule,
    with_path,
)
from faas_gpu.policies.infless.schedule import Server

# the classify model on this machine: ~1.1 ms at batch 1, ~0.4 ms an image at large batches
MODEL_MS = {1: 1.1, 2: 1.6, 4: 2.4, 8: 3.3, 16: 6.5, 32: 13.0}
PATH = PathCost(fixed_s=0.0022, per_item_s=0.0021)  # the shape `faas-gpu profile --path` fits here


def cands(path=None, factor=1.0):
    return [with_path(Candidate(b, 1, 0, ms / 1000), path, factor) for b, ms in MODEL_MS.items()]


def test_fit_recovers_fixed_and_per_item_cost():
    truth = PathCost(0.002, 0.0015)
    fitted = PathCost.fit([(b, truth.batch_s(b)) for b in (1, 8, 32)])
    assert fitted.fixed_s == pytest.approx(0.002) and fitted.per_item_s == pytest.approx(0.0015)


def test_fit_clips_noise_to_non_negative_parts():
    assert PathCost.fit([(1, 0.004), (8, 0.003)]).per_item_s == 0.0  # slower at batch 1 than 8: all fixed
    neg = PathCost.fit([(1, 0.001), (8, 0.016)])  # intercept < 0: all per item
    assert neg.fixed_s == 0.0 and neg.per_item_s > 0
    assert PathCost.fit([(1, 0.004)]) == PathCost(0.004, 0.0)
    with pytest.raises(ValueError):
        PathCost.fit([])
    with pytest.raises(ValueError):
        PathCost(-1.0, 0.0)


def test_the_path_brings_batch_1_capacity_down_to_what_the_path_serves():
    alone = bounds(MODEL_MS[1] / 1000, 0.25, 1).r_up
    with_it = bounds(with_path(Candidate(1, 1, 0, MODEL_MS[1] / 1000), PATH).t_exec_s, 0.25, 1).r_up
    assert alone > 800  # the 1,043 rps from model time alone
    assert with_it < 250  # the path saturates at ~230 rps


def test_algorithm_1_batches_a_load_batch_1_cannot_serve_only_when_the_path_is_counted():
    server = [Server("local", 2, [])]
    blind = schedule(240, cands(), server, 0.25, max_instances=1)
    assert [p.candidate.batch for p in blind.placements] == [32]  # model time alone: any batch "fits"
    # what matters is batch 1's predicted r_up, which the dispatcher compares to the load
    b1_blind = bounds(MODEL_MS[1] / 1000, 0.25, 1).r_up
    b1_path = bounds(cands(PATH)[0].t_exec_s, 0.25, 1).r_up
    assert b1_blind >= 240 > b1_path  # only with the path does 240 rps call for more than batch 1
    planned = schedule(240, cands(PATH), server, 0.25, max_instances=2)
    assert planned.unplaced_rps == 0
    assert max(p.candidate.batch for p in planned.placements) > 1
    assert all(p.timeout_s < 0.25 - p.candidate.t_exec_s + 1e-9 for p in planned.placements)


def test_observed_capacity_counts_only_when_requests_queue():
    assert observed_capacity(200.0, in_flight=32, batch_slots=1) == 200.0
    assert observed_capacity(200.0, in_flight=2, batch_slots=8) is None  # not saturated: says nothing
    assert observed_capacity(0.0, in_flight=50, batch_slots=1) is None


def test_a_shortfall_corrects_the_model_and_a_met_prediction_does_not():
    assert correction(500.0, 230.0) == pytest.approx(500 / 230)
    assert correction(1043.0, 230.0) == 4.0  # one step moves at most 4x: one bad window cannot throw it far
    assert correction(100.0, 300.0) == pytest.approx(1 / 3)  # faster than predicted: taken back
    assert correction(100.0, 1000.0) == 0.25
    assert correction(240.0, 230.0) is None
    assert correction(240.0, None) is None
    slowed = with_path(Candidate(1, 1, 0, 0.001), None, correction(1000.0, 250.0))
    assert slowed.t_exec_s == pytest.approx(0.004)
    assert bounds(slowed.t_exec_s, 0.25, 1).r_up == 250


def test_queueing_asks_for_more_than_the_plan_serves():
    """A closed loop arrives only as fast as it is served: the queue, not the rate, says it wants more."""
    assert demand(230.0, r_max=240.0, saturated=False) == 230.0
    assert demand(230.0, r_max=240.0, saturated=True) == 300.0
    assert demand(500.0, r_max=240.0, saturated=True) == 500.0
