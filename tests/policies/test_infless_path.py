"""INFless's capacity model with the serving path's cost, and its correction by what is observed."""

import pytest

from faas_gpu.policies.infless import (
    Candidate,
    PathCost,
    batch_timeout_s,
    bounds,
    correction,
    corrections,
    demand,
    feasible,
    observed_capacity,
    path_rate,
    schedule,
    with_path,
)
from faas_gpu.policies.infless.capacity import PATH_MARGIN
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
    # served above the plan's prediction: headroom over what is served, not over the plan
    assert demand(290.0, r_max=200.0, saturated=True, observed=290.0) == pytest.approx(362.5)
    assert demand(230.0, r_max=240.0, saturated=True, observed=200.0) == 300.0  # a shortfall: the plan's
    assert demand(290.0, r_max=200.0, saturated=False, observed=290.0) == 290.0


# -- the path as a node resource ---------------------------------------------------------------


def test_the_paths_cpu_per_request_falls_with_the_batch_and_defaults_to_its_time():
    assert PATH.cpu_per_request_s(1) == pytest.approx(0.0043)
    assert PATH.cpu_per_request_s(8) == pytest.approx(0.0022 / 8 + 0.0021)
    measured = PathCost(0.0022, 0.0021, cpu_fixed_s=0.004, cpu_per_item_s=0.001)  # CPU seconds given
    assert measured.cpu_per_request_s(4) == pytest.approx(0.002)
    assert PATH.cpu_scaled(2.0).cpu_per_request_s(1) == pytest.approx(0.0086)
    assert PATH.cpu_scaled(2.0).batch_s(1) == PATH.batch_s(1)  # the CPU is dearer, the batch no slower


def test_path_rate_is_what_the_cores_left_pay_the_path_for():
    c1, c8 = cands(PATH)[0], cands(PATH)[3]
    up1 = bounds(c1.t_exec_s, 0.25, 1).r_up
    assert path_rate(c1, up1, 8.0, None) == up1
    assert path_rate(c1, up1, 8.0, PATH) == up1  # plenty of cores: Eq. 1 binds
    assert path_rate(c1, 1000.0, 2.0, PATH) == 232  # 1 core left / 4.3 ms a request
    assert path_rate(c8, 1000.0, 2.0, PATH) == 416  # a batch of 8 pays the fixed part once: more per core
    assert path_rate(c8, 1000.0, 2.0, PATH) % 8 == 0  # whole batches a second
    assert path_rate(c1, 1000.0, 1.0, PATH) == 0.0  # no core left for the path


def test_a_second_instance_adds_no_path_capacity_beyond_the_nodes_cpu():
    """Run 6 of EXPERIMENTS: two instances on 2 cores were predicted 300 rps and served 24."""
    node = [Server("local", 2, [])]
    per_instance = schedule(1000, cands(PATH), node, 0.25, max_instances=2)
    assert len(per_instance.placements) == 2  # Eq. 1 alone: each instance brings its own path
    shared = schedule(1000, cands(PATH), node, 0.25, max_instances=2, path=PATH)
    assert len(shared.placements) == 1  # the cores its path needs are the second instance's
    p = shared.placements[0]
    assert p.r_up <= (2 - p.candidate.cpu) / PATH.cpu_per_request_s(p.candidate.batch) + 1e-9
    assert p.candidate.batch == 32  # the largest batch pays the path's per-batch part least
    assert shared.servers[0].cpu_free >= -1e-9
    assert sum(x.r_up for x in shared.placements) < sum(x.r_up for x in per_instance.placements)


def test_more_cores_let_more_instances_share_the_path():
    node = [Server("local", 16, [])]
    plan = schedule(3000, cands(PATH), node, 0.25, max_instances=8, path=PATH)
    used = sum(p.candidate.cpu + p.r_up * PATH.cpu_per_request_s(p.candidate.batch) for p in plan.placements)
    assert len(plan.placements) > 1 and used <= 16 + 1e-9
    assert plan.servers[0].cpu_free == pytest.approx(16 - used)


def test_a_dearer_path_cuts_instances_and_keeps_the_largest_batch():
    node = [Server("local", 4, [])]
    plans = [
        schedule(1000, cands(PATH), node, 0.25, max_instances=4, path=path)
        for path in (PathCost(0.0, 0.0), PATH, PATH.cpu_scaled(4.0))  # free, as profiled, 4x dearer
    ]
    counts = [len(p.placements) for p in plans]
    assert counts[0] > counts[1] > counts[2] == 1, counts
    assert all(p.placements[0].candidate.batch == 32 for p in plans)  # the batch does not shrink
    assert plans[2].placements[0].r_up <= 3 / PATH.cpu_scaled(4.0).cpu_per_request_s(32) + 1e-9


def test_a_shortfall_makes_the_paths_cpu_dearer_before_it_slows_the_model():
    assert corrections(1.0, 1.0, 2.0, path_known=True) == (2.0, 1.0)
    # the path's lever is spent at 4: the rest slows the model
    assert corrections(2.0, 1.0, 4.0, path_known=True) == (4.0, 2.0)
    assert corrections(4.0, 1.0, 2.0, path_known=True) == (4.0, 2.0)
    assert corrections(1.0, 1.0, 2.0, path_known=False) == (1.0, 2.0)  # no path cost: only the model is left
    assert corrections(4.0, 2.0, 0.25, path_known=True) == (2.0, 1.0)  # a surplus takes the model's back first
    assert corrections(2.0, 1.0, 0.1, path_known=True) == (1.0, 1.0)  # never below 1
    assert corrections(3.0, 1.5, 1.0, path_known=True) == (3.0, 1.5)


# -- the batch timeout leaves a margin for the path --------------------------------------------


def test_the_batch_timeout_leaves_the_paths_time_again_for_its_variance():
    c = cands(PATH)[3]  # batch 8: 3.3 ms of model, 19.0 ms of path
    assert c.path_s == pytest.approx(PATH.batch_s(8))
    assert PATH_MARGIN == 1.0
    timeout = batch_timeout_s(c.t_exec_s, 0.25, 8, c.path_s)
    assert timeout == pytest.approx(0.25 - c.t_exec_s - c.path_s)
    # a batch that waited its whole timeout still meets the SLO when the path runs twice as slow
    assert timeout + (c.t_exec_s - c.path_s) + 2 * c.path_s <= 0.25 + 1e-12
    assert batch_timeout_s(c.t_exec_s, 0.25, 8) == pytest.approx(0.25 - c.t_exec_s)  # the paper's, no path
    assert batch_timeout_s(c.t_exec_s, 0.25, 1, c.path_s) == 0.0
    assert with_path(c, None).path_s == c.path_s and cands()[3].path_s == 0.0


def test_r_low_counts_the_shorter_timeout_and_placements_carry_it():
    c = cands(PATH)[5]  # batch 32: 13 ms of model, 69.4 ms of path
    assert bounds(c.t_exec_s, 0.25, 32, c.path_s).r_low > bounds(c.t_exec_s, 0.25, 32).r_low
    assert not feasible(c, 0.25, 300)  # 300 rps no longer fills a batch of 32 within the shorter timeout
    plan = schedule(240, cands(PATH), [Server("local", 2, [])], 0.25, max_instances=2, path=PATH)
    for p in plan.placements:
        assert p.timeout_s == pytest.approx(
            batch_timeout_s(p.candidate.t_exec_s, 0.25, p.candidate.batch, p.candidate.path_s)
        )
        assert p.timeout_s + p.candidate.t_exec_s + PATH_MARGIN * p.candidate.path_s <= 0.25 + 1e-9
