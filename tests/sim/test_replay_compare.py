"""`faas-gpu replay`'s comparison (`faas_gpu.sim.replay`): a run's figures, the profiles measured
from the live answers, the simulator on the same arrivals, and the sim / live verdict."""

from __future__ import annotations

import pytest

from faas_gpu.sim.replay import (
    FIGURES,
    Figures,
    KeepAliveFigures,
    Outcome,
    Profile,
    ReplicaSample,
    compare,
    figures,
    keepalive_table,
    keepalive_verdict,
    live_keepalive,
    measured_profiles,
    measured_service_s,
    minute_counts,
    policy_order,
    ratio,
    same_order,
    serving_path_s,
    simulate_keepalive,
    simulate_side,
    table,
    unit_hop_s,
    verdict,
)
from faas_gpu.sim.scenario import Cluster


def fig(mean: float, misses: int = 0, hits: int = 10, slo: int = 0, p99: float | None = None) -> Figures:
    return Figures(hits + misses, hits + misses, 0, mean, p99 or 2 * mean, slo, misses, hits)


def test_figures_count_errors_as_slo_misses_and_only_answered_latencies():
    outcomes = [
        Outcome("a", 0.0, 0.1, cache="hit"),
        Outcome("a", 0.1, 0.3, cache="miss"),
        Outcome("b", 0.2, 2.0, cache="hit"),
        Outcome("b", 0.3, None, status=504),
    ]
    f = figures(outcomes, {"a": 0.5, "b": 1.0})
    assert (f.requests, f.answered, f.errors) == (4, 3, 1)
    assert f.mean_latency == pytest.approx(0.8)
    assert f.slo_misses == 2  # b's 2 s answer and b's 504
    assert (f.cold_starts, f.hits) == (1, 2)
    assert f.hit_ratio == pytest.approx(2 / 3) and f.miss_ratio == pytest.approx(1 / 3)
    assert figures([], {}).mean_latency == 0.0
    sim = [Outcome(o.function, o.sent_s, 0.1 if o.answered else 9.0) for o in outcomes]
    same_requests = figures(sim, {"b": 1.0}, among=outcomes)  # the live 504 is left out of the latencies
    assert same_requests.mean_latency == pytest.approx(0.1) and same_requests.slo_misses == 1


def test_a_ratio_is_one_where_both_are_zero_and_none_where_only_live_is():
    assert ratio(0.0, 0.0) == 1.0
    assert ratio(3.0, 0.0) is None
    assert ratio(1.1, 1.0) == pytest.approx(1.1)


def test_compare_names_every_policy_and_figure():
    live = {"lb": fig(0.4, misses=5), "lalb": fig(0.2, misses=1)}
    sim = {"lb": fig(0.44, misses=4), "lalb": fig(0.18, misses=1)}
    ratios = compare(sim, live)
    assert set(ratios) == {f"sim_over_live_{p}_{f}" for p in live for f in FIGURES}
    assert ratios["sim_over_live_lb_mean_latency"] == pytest.approx(1.1)
    assert ratios["sim_over_live_lb_cold_starts"] == pytest.approx(0.8)
    assert ratios["sim_over_live_lalb_slo_misses"] == 1.0  # 0 and 0 agree


def test_the_policy_order_agrees_within_ties_and_not_across_a_clear_swap():
    live = {"lb": fig(0.40), "lalb": fig(0.20), "lalb_o3": fig(0.195)}
    assert policy_order(live, "mean_latency") == ["lalb_o3", "lalb", "lb"]
    tied_other_way = {"lb": fig(0.38), "lalb": fig(0.19), "lalb_o3": fig(0.196)}  # o3 vs lalb within 5%
    assert same_order(tied_other_way, live, "mean_latency")
    swapped = {"lb": fig(0.15), "lalb": fig(0.20), "lalb_o3": fig(0.20)}  # lb clearly best on the sim side
    assert not same_order(swapped, live, "mean_latency")
    assert policy_order({"lb": fig(0.1, misses=5), "lalb": fig(0.1, misses=1)}, "hit_ratio") == ["lalb", "lb"]


def test_the_verdict_says_whether_the_goal_figures_are_within_20_percent():
    live = {"lb": fig(0.40, misses=5), "lalb": fig(0.20, misses=2)}
    good = verdict({"lb": fig(0.45, misses=5), "lalb": fig(0.18, misses=2)}, live)
    assert good["same_policy_order"] is True and good["within_20pct"] is True
    assert good["policy_order_live"] == good["policy_order_sim"] == ["lalb", "lb"]
    off = verdict({"lb": fig(0.60, misses=5), "lalb": fig(0.18, misses=2)}, live)
    assert off["within_20pct"] is False and off["sim_over_live_lb_mean_latency"] == pytest.approx(1.5)
    text = table({"lb": fig(0.45, misses=5)}, {"lb": fig(0.40, misses=5)})
    assert "mean_latency (s)" in text and "1.12" in text


def test_profiles_path_and_overhead_come_from_the_answers():
    calls = [  # one at a time: scheduler time = overhead + load + execute
        Outcome("a", 0, 0.050, cache="hit", scheduler_s=0.040, exec_s=0.030),
        Outcome("a", 0, 0.060, cache="hit", scheduler_s=0.042, exec_s=0.031),
        Outcome("b", 0, 0.300, cache="miss", scheduler_s=0.290, load_s=0.200, exec_s=0.080),
    ]
    hop = unit_hop_s(calls)
    assert hop == pytest.approx(0.010)
    busy = [Outcome("a", t, 0.2, scheduler_s=0.01 + 0.03 + (0.1 if t % 2 else 0.0), exec_s=0.03) for t in range(40)]
    assert unit_hop_s(calls, busy) == pytest.approx(0.01)  # enough answers: their unqueued quarter
    assert serving_path_s(calls) == pytest.approx(0.038 / 3)  # the mean of 10, 18 and 10 ms
    live = [
        Outcome("a", 0, 0.5, cache="miss", scheduler_s=0.4, load_s=0.25, exec_s=0.02, model_mb=8.2),
        Outcome("a", 1, 0.1, cache="hit", scheduler_s=0.05, exec_s=0.04, model_mb=8.2),
        Outcome("a", 2, None, status=503),
        Outcome("b", 3, 0.2, cache="hit", scheduler_s=0.1, exec_s=0.09),
    ]
    fallback = {"a": Profile(8.0, 0.3, 0.05), "b": Profile(16.0, 0.4, 0.1), "c": Profile(32.0, 0.5, 0.2)}
    p = measured_profiles(live, fallback, hop)
    assert p["a"] == Profile(8.2, 0.25, pytest.approx(0.03 + 0.01))
    assert p["b"] == Profile(16.0, 0.4, pytest.approx(0.09 + 0.01))  # no miss in the run: the earlier load
    assert p["c"] == fallback["c"]  # never called
    assert measured_service_s(live, hop) == [pytest.approx(0.03), pytest.approx(0.05), None, pytest.approx(0.1)]


def test_the_simulator_side_starts_from_the_live_caches_and_adds_the_path():
    profiles = {"a": Profile(40.0, 1.0, 0.1), "b": Profile(40.0, 1.0, 0.1)}
    arrivals = [(0.0, "a"), (5.0, "b")]
    cold = simulate_side(arrivals, profiles, Cluster(1, 1, 100.0), "lalb", 0, 0.02)
    assert [o.cache for o in cold.outcomes] == ["miss", "miss"]
    assert cold.outcomes[0].latency_s == pytest.approx(1.1 + 0.02)
    warm = simulate_side(arrivals, profiles, Cluster(1, 1, 100.0), "lalb", 0, 0.02, warm={0: ["a", "b"]})
    assert [o.cache for o in warm.outcomes] == ["hit", "hit"]
    assert warm.outcomes[1].latency_s == pytest.approx(0.1 + 0.02)
    measured = simulate_side(arrivals, profiles, Cluster(1, 1, 100.0), "lalb", 0, 0.0, {0: ["a"]}, [0.3, 0.2])
    assert [o.latency_s for o in measured.outcomes] == [pytest.approx(0.3), pytest.approx(1.0 + 0.2)]


def test_the_simulator_side_holds_requests_in_the_class_queue_as_the_scheduler_does():
    """LB with admission sees at most one queued job per unit: a burst of four on two units runs
    in arrival order, two at a time (and without the class queue, the same order: LB is FIFO)."""
    profiles = {"a": Profile(10.0, 0.0, 1.0)}
    burst = [(0.0, "a")] * 4
    side = simulate_side(burst, profiles, Cluster(1, 2, 100.0), "lb", 0, 0.0, warm={0: ["a"], 1: ["a"]})
    assert sorted(round(o.latency_s, 6) for o in side.outcomes) == [1.0, 1.0, 2.0, 2.0]


# -- INFless keep-alive: LSTH against HHP ----------------------------------------------------------


def test_minute_counts_put_each_request_in_its_trace_minute():
    arrivals = [(0.5, "a"), (1.9, "a"), (2.1, "b"), (7.9, "a"), (9.0, "a")]  # compressed 30 times: 2 s a minute
    assert minute_counts(arrivals, ["a", "b", "c"], 30.0, 4) == {"a": [2, 0, 0, 1], "b": [0, 1, 0, 0], "c": [0] * 4}


def test_the_simulators_keep_alive_is_the_fig_16_replay_of_the_annotations_policy(monkeypatch):
    import faas_gpu.sim.replay as replay_module
    from faas_gpu.policies.infless import HybridHistogram, LongShortTermHistogram, keepalive_policy
    from faas_gpu.sim.infless import replay_keepalive

    assert replay_module.keepalive_policy is keepalive_policy and replay_module.replay_keepalive is replay_keepalive
    assert isinstance(keepalive_policy("LSTH"), LongShortTermHistogram) and isinstance(
        keepalive_policy("hhp"), HybridHistogram
    )
    counts = {"a": [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "b": [0, 2, 0, 0]}
    lsth = simulate_keepalive(counts, "lsth")
    expect = [replay_keepalive(c, LongShortTermHistogram()) for c in counts.values()]
    assert lsth.cold_starts == sum(s.cold_starts for s in expect) and lsth.invocations == 4
    assert lsth.idle_minutes == pytest.approx(sum(s.wasted_minutes for s in expect))
    assert simulate_keepalive(counts, "hhp").cold_starts == 2  # HHP's default keeps both warm for 4 h


def test_the_live_keep_alive_counts_processes_started_for_a_waiting_request_and_idle_ready_time():
    outcomes = [
        Outcome("a", 0.1, 3.0, process="11", cold=True),
        Outcome("a", 0.3, 2.8, process="11", cold=True),  # the same cold start, two requests waiting for it
        Outcome("a", 5.0, 0.05, process="11", cold=False),
        Outcome("a", 9.0, 0.05, process="12", cold=False),  # pre-warmed: started before the request
        Outcome("b", 1.0, None, status=503),
    ]
    counts = {"a": [1, 0, 1, 0, 1], "b": [1, 0, 0, 0, 0]}  # minutes of 2 s (compressed 30 times)
    samples = [ReplicaSample(t, "a", 1) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)] + [
        ReplicaSample(t, "b", 0) for t in (0.0, 5.0)
    ]
    live = live_keepalive(outcomes, samples, counts, 30.0, 5)
    assert (live.cold_starts, live.invocations, live.answered) == (1, 5, 4)
    assert live.idle_minutes == pytest.approx(1.0)  # ready through minute 1 (2-4 s), which had no call
    sim = {"lsth": KeepAliveFigures(5, 5, 2, 3.0), "hhp": KeepAliveFigures(5, 5, 1, 9.0)}
    both = {"lsth": KeepAliveFigures(5, 5, 3, 2.0), "hhp": KeepAliveFigures(5, 5, 1, 8.0)}
    v = keepalive_verdict(sim, both)
    assert v["sim_over_live_lsth_cold_starts"] == round(2 / 3, 4) and v["same_keepalive_order"] is True
    assert "lsth       cold_starts" in keepalive_table(sim, both)
