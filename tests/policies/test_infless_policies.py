"""INFless's pure policies: Eq. 1, the dispatcher's three cases, Algorithm 1 and the keep-alive policies."""

from collections import Counter

import pytest

from faas_gpu.policies.infless import (
    Candidate,
    FixedKeepAlive,
    HybridHistogram,
    InstanceLoad,
    LongShortTermHistogram,
    Server,
    WeightedSplitter,
    batch_timeout_s,
    bounds,
    dispatch,
    feasible,
    schedule,
)


def test_bounds_match_the_papers_example():
    # §3.2: SLO 200 ms, t_exec 50 ms, batch 4 -> [28, 80] RPS
    b = bounds(0.050, 0.200, 4)
    assert (b.r_low, b.r_up) == (28, 80)
    assert batch_timeout_s(0.050, 0.200, 4) == pytest.approx(0.150)


def test_a_batch_of_one_never_waits():
    b = bounds(0.030, 0.050, 1)
    assert b.r_low == 0 and b.r_up == 33
    assert batch_timeout_s(0.030, 0.050, 1) == 0


def test_batches_need_t_exec_at_most_half_the_slo_and_enough_load():
    ok = Candidate(4, 1, 0, 0.050)
    assert feasible(ok, 0.200, residual_rps=28)
    assert not feasible(ok, 0.200, residual_rps=27)  # the batch would not fill before its timeout
    assert not feasible(Candidate(4, 1, 0, 0.101), 0.200, residual_rps=1000)
    assert feasible(Candidate(1, 1, 0, 0.190), 0.200, residual_rps=1)
    assert not feasible(Candidate(1, 1, 0, 0.210), 0.200, residual_rps=1)


def test_bad_bounds_input_is_refused():
    with pytest.raises(ValueError, match="t_exec"):
        bounds(0, 0.2, 4)


def test_over_capacity_every_instance_runs_at_its_upper_bound_and_the_rest_scales_up():
    d = dispatch([InstanceLoad("a", 28, 80), InstanceLoad("b", 10, 20)], 130)
    assert d.case == "scale-up"
    assert d.rates == {"a": 80, "b": 20}
    assert d.scale_up_rps == 30


def test_in_range_each_instance_sits_below_its_upper_bound_in_proportion_to_its_range():
    inst = [InstanceLoad("a", 28, 80), InstanceLoad("b", 10, 20)]
    d = dispatch(inst, 90)  # R_max 100, R_min 38: threshold 0.8*38 + 0.2*100 = 50.4
    assert d.case == "steady" and not d.release
    frac = (100 - 90) / (100 - 38)
    assert d.rates["a"] == pytest.approx(80 - frac * 52)
    assert d.rates["b"] == pytest.approx(20 - frac * 10)
    assert sum(d.rates.values()) == pytest.approx(90)


def test_under_the_low_water_mark_instances_are_released_but_never_below_keep():
    inst = [InstanceLoad("a", 28, 80), InstanceLoad("b", 28, 80), InstanceLoad("c", 28, 80)]
    d = dispatch(inst, 60)
    assert d.case == "release" and len(d.release) == 2
    assert sum(d.rates.values()) == pytest.approx(60)
    assert dispatch(inst, 60, keep=3).release == []
    assert len(dispatch(inst, 60, keep=2).release) == 1


def test_release_never_leaves_less_capacity_than_the_load():
    inst = [InstanceLoad("big", 60, 100), InstanceLoad("small", 0, 10)]
    d = dispatch(inst, 95)
    assert "big" not in d.release


def test_the_splitter_sends_requests_in_the_dispatched_proportions():
    s = WeightedSplitter()
    s.set_weights({"a": 60.0, "b": 30.0, "c": 10.0})
    picks = Counter(s.pick(["a", "b", "c"]) for _ in range(1000))
    assert picks == {"a": 600, "b": 300, "c": 100}
    # within any 10 consecutive picks each instance is within one request of its share
    window = [s.pick(["a", "b", "c"]) for _ in range(10)]
    assert abs(window.count("a") - 6) <= 1 and abs(window.count("c") - 1) <= 1


def test_the_splitter_skips_instances_that_are_not_ready():
    s = WeightedSplitter()
    s.set_weights({"a": 1.0, "b": 100.0})
    assert {s.pick(["a"]) for _ in range(5)} == {"a"}
    assert s.pick([]) is None


CANDIDATES = [
    Candidate(8, 2, 20, 0.090),
    Candidate(4, 2, 10, 0.080),
    Candidate(4, 1, 10, 0.095),
    Candidate(2, 1, 10, 0.050),
    Candidate(1, 1, 10, 0.030),
    Candidate(1, 2, 0, 0.150),
]


def test_greedy_scaling_tries_large_batches_first_and_ends_non_uniform():
    servers = [Server("s1", 16, [100, 100, 100]), Server("s2", 16, [100, 100, 100])]
    r = schedule(300, CANDIDATES, servers, 0.200)
    batches = [p.candidate.batch for p in r.placements]
    assert batches[0] == 8 and batches == sorted(batches, reverse=True)
    assert len(set(batches)) >= 2  # the residual was too small for a full batch of 8
    assert r.unplaced_rps == 0
    assert sum(p.r_up for p in r.placements) >= 300
    assert servers[0].cpu_free == 16  # the input is not modified


@pytest.mark.parametrize("max_batch", [1, 2, 4])
def test_no_plan_has_a_batch_above_what_the_model_accepts(max_batch):
    """Issue 43: a program exported with a static batch of 1 (or a Dim range up to N) runs no
    larger batch; the plan stays within it and still serves the load with smaller batches."""
    servers = [Server("s1", 16, [100, 100, 100]), Server("s2", 16, [100, 100, 100])]
    r = schedule(300, CANDIDATES, servers, 0.200, max_batch=max_batch)
    batches = [p.candidate.batch for p in r.placements]
    assert batches and max(batches) <= max_batch
    assert max(batches) == max_batch  # the largest it accepts is still preferred


@pytest.mark.parametrize("rows", [1, 8, 12, 32])
def test_instances_together_take_no_more_rows_than_the_calls_in_flight(rows):
    """Issue 46: an instance serves only calls waiting for it, and a batch fills only from them.
    With `rows` calls in flight at once, a plan's batches add up to at most `rows` (one instance of
    batch 1 always: something serves); unbounded, the same load is planned as more rows than
    there are calls."""
    servers = [Server("s1", 16, [100, 100, 100]), Server("s2", 16, [100, 100, 100])]
    unbounded = schedule(300, CANDIDATES, servers, 0.200)
    assert sum(p.candidate.batch for p in unbounded.placements) > 12
    r = schedule(300, CANDIDATES, servers, 0.200, rows_in_flight=rows)
    batches = [p.candidate.batch for p in r.placements]
    assert batches and sum(batches) <= rows
    assert sum(p.r_up for p in r.placements) + r.unplaced_rps >= 300 - 1e-6
    assert max(batches) == min(8, rows)  # the largest batch the calls fill is still preferred


def test_greedy_scaling_packs_the_server_that_fragments_least():
    servers = [Server("roomy", 32, [100, 100]), Server("tight", 2, [20])]
    r = schedule(80, [Candidate(8, 2, 20, 0.090)], servers, 0.200)
    assert [p.server for p in r.placements] == ["tight"]


def test_a_full_cluster_leaves_the_residual_unplaced():
    r = schedule(1000, CANDIDATES, [Server("s", 2, [20])], 0.200)
    assert r.unplaced_rps > 0
    assert sum(p.candidate.cpu for p in r.placements) <= 2


def test_without_resource_scheduling_the_highest_throughput_config_wins():
    cands = [Candidate(4, 1, 10, 0.080), Candidate(4, 8, 60, 0.040)]
    servers = [Server("s", 16, [100])]
    eff = schedule(40, cands, servers, 0.200)
    thr = schedule(40, cands, servers, 0.200, select="max-throughput")
    assert eff.placements[0].candidate.cpu == 1
    assert thr.placements[0].candidate.cpu == 8


def test_an_infeasible_slo_places_nothing():
    r = schedule(50, CANDIDATES, [Server("s", 16, [100])], 0.020)
    assert r.placements == [] and r.unplaced_rps == 50


def _every(period: int, until: int) -> list[int]:
    return list(range(0, until, period))


def test_lsth_prewarms_before_a_periodic_arrival_and_keeps_alive_past_it():
    minutes = _every(10, 24 * 60)
    w = LongShortTermHistogram().windows(minutes, minutes[-1])
    assert w.prewarm_s == 9 * 60  # floor(10 * 0.9) minutes: loaded again just before the next call
    assert 0 < w.keepalive_s <= 3 * 60


def test_lsth_weighs_the_short_window_against_the_long_one():
    # most of a day of 30-minute gaps, then two hours of 2-minute gaps
    minutes = _every(30, 22 * 60) + list(range(22 * 60, 24 * 60, 2))
    lsth = LongShortTermHistogram(gamma=0.5).windows(minutes, minutes[-1])
    long_only = LongShortTermHistogram(gamma=1.0).windows(minutes, minutes[-1])
    short_only = LongShortTermHistogram(gamma=0.0).windows(minutes, minutes[-1])
    assert short_only.keepalive_s < lsth.keepalive_s < long_only.keepalive_s


def test_hhp_falls_back_to_its_whole_range_without_a_representative_histogram():
    assert HybridHistogram().windows([0, 5, 9], 9).keepalive_s == 240 * 60
    periodic = HybridHistogram().windows(_every(10, 24 * 60), 24 * 60)
    assert periodic.prewarm_s == 9 * 60


def test_fixed_keepalive_is_fixed():
    assert FixedKeepAlive(300).windows(_every(10, 100), 100).keepalive_s == 300
    with pytest.raises(ValueError, match="gamma"):
        LongShortTermHistogram(gamma=2)


def test_lsth_does_not_trust_a_quiet_hours_one_idle_time():
    # a day of calls every 2 minutes, a 69-minute gap, then the burst goes on
    minutes = list(range(0, 22 * 60, 2)) + [22 * 60 + 69]
    literal = LongShortTermHistogram(min_samples=0).windows(minutes, minutes[-1])
    guarded = LongShortTermHistogram().windows(minutes, minutes[-1])
    assert literal.prewarm_s >= 30 * 60  # §3.5 to the letter: unload now, the burst's next minute is cold
    assert guarded.prewarm_s <= 60  # the day's histogram stands in for the hour's single idle time


def test_hhp_can_track_only_the_last_hours_as_infless_describes_it():
    minutes = list(range(0, 19 * 60, 10)) + list(range(19 * 60, 24 * 60, 3))
    # the tail: 10-minute gaps over all history, 3-minute ones over the last 4 h
    assert HybridHistogram().windows(minutes, minutes[-1]).keepalive_s == 9 * 60
    assert HybridHistogram(window_min=240).windows(minutes, minutes[-1]).keepalive_s == 2 * 60
