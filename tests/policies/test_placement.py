"""LALB's branches (Algorithms 1 and 2) one by one, on hand-made cluster states; and LB."""

from __future__ import annotations

import pytest

from faas_gpu.policies import LALBScheduler, LBScheduler, Model, ModelCache, PlacementError, Request, Unit

MODELS = {
    "a": Model("a", 3000, load_s=3.0, infer_s=1.0),
    "b": Model("b", 3000, load_s=3.0, infer_s=1.0),
    "c": Model("c", 3000, load_s=3.0, infer_s=1.0),
    "d": Model("d", 3000, load_s=3.0, infer_s=1.0),
}


def cluster(n: int = 2, memory: float = 8192) -> list[Unit]:
    return [Unit(id=i, cache=ModelCache(memory)) for i in range(n)]


def cache(sched, unit_id: int, *models: str) -> None:
    """Pre-load models on a unit, as if earlier jobs had left them there."""
    for m in models:
        sched.units[unit_id].cache.load(m, MODELS[m].size_mb)
        sched.holders.setdefault(m, set()).add(unit_id)


def occupy(sched, unit_id: int, model: str, now: float = 0.0, busy_for: float | None = None) -> None:
    """Make a unit busy with a job of `model` (cached there) for `busy_for` seconds."""
    cache(sched, unit_id, model)
    unit = sched.units[unit_id]
    unit.running = Request(-1, model, now)
    unit.busy_until = now + (busy_for if busy_for is not None else MODELS[model].infer_s)
    sched.idle.discard(unit_id)


def submit(sched, *models: str, now: float = 0.0) -> list[Request]:
    reqs = []
    for i, m in enumerate(models):
        r = Request(100 + len(sched.queue) + i, m, now)
        sched.submit(r, now)
        reqs.append(r)
    return reqs


def test_cache_hit_on_an_idle_unit():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=0)
    cache(s, 1, "a")
    submit(s, "a")
    (d,) = s.schedule(0.0)
    assert d.unit == 1 and d.hit and not d.false_miss and d.duration == 1.0


def test_hit_on_busy_unit_beats_miss_on_idle():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=0)
    occupy(s, 0, "a", busy_for=1.0)  # finishes in 1 s < a's 3 s load
    (r,) = submit(s, "a")
    assert s.schedule(0.0) == []
    assert list(s.units[0].local_queue) == [r] and s.units[1].idle
    s.complete(0, 1.0)
    (d,) = s.schedule(1.0)  # the local queue comes first
    assert d.unit == 0 and d.hit and d.request is r


def test_miss_on_idle_when_the_busy_holder_is_slower():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=0)
    occupy(s, 0, "a", busy_for=10.0)  # 10 s > 3 s load
    submit(s, "a")
    (d,) = s.schedule(0.0)
    assert d.unit == 1 and not d.hit and d.false_miss and d.duration == 4.0


def test_model_cached_nowhere_is_a_true_miss():
    s = LALBScheduler(cluster(1), MODELS, o3_limit=0)
    submit(s, "b")
    (d,) = s.schedule(0.0)
    assert not d.hit and not d.false_miss


def test_request_goes_to_the_other_idle_unit_that_holds_its_model():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=0)
    s.units[0].dispatches = 0
    s.units[1].dispatches = 5  # unit 0 is asked first
    cache(s, 1, "b")
    submit(s, "b", "c")
    ds = {d.request.model: d for d in s.schedule(0.0)}
    assert ds["b"].unit == 1 and ds["b"].hit  # Algorithm 2 lines 4-6
    assert ds["c"].unit == 0 and not ds["c"].hit


def test_a_unit_that_took_a_hit_through_algorithm_2_gets_nothing_more_in_that_round():
    """With a unit preference, unit 0 passes over b (wanted on unit 1), then b's preference falls
    away once unit 1 is taken and Algorithm 2 finds unit 0 an idle holder of b: unit 0 is busy from
    then on, and c (cached nowhere) must not be dispatched to it as well (found by the PROTEAN
    simulator at 8,000 req/s: two jobs on one slice in one round)."""
    s = LALBScheduler(cluster(2), MODELS, o3_limit=25)
    cache(s, 0, "b")
    s.unit_preference = lambda request, idle: {1} if request.model in ("a", "b") else None
    submit(s, "a", "b", "c")
    ds = s.schedule(0.0)
    assert len({d.unit for d in ds}) == len(ds)  # one job per unit and round
    assert {d.request.model: d.unit for d in ds} == {"a": 1, "b": 0}
    assert [r.model for r in s.queue.values()] == ["c"]


def test_out_of_order_dispatch_promotes_a_later_hit():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=25)
    occupy(s, 1, "d", busy_for=100.0)
    cache(s, 0, "a")
    first, second = submit(s, "b", "a")
    (d,) = s.schedule(0.0)
    assert d.request is second and d.unit == 0 and d.hit
    assert s.visits(first) == 1


def test_plain_lalb_dispatches_in_order():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=0)
    occupy(s, 1, "d", busy_for=100.0)
    cache(s, 0, "a")
    first, _ = submit(s, "b", "a")
    (d,) = s.schedule(0.0)
    assert d.request is first and not d.hit


def test_skip_limit_forces_dispatch():
    limit = 3
    s = LALBScheduler(cluster(2), MODELS, o3_limit=limit)
    occupy(s, 1, "d", busy_for=1e9)
    cache(s, 0, "a")
    (starved,) = submit(s, "b")
    now = 0.0
    for i in range(limit):  # each round a later hit on "a" jumps the queue
        submit(s, "a", now=now)
        (d,) = s.schedule(now)
        assert d.request.model == "a", f"round {i}"
        now += 1.0
        s.complete(0, now)
    assert s.visits(starved) == limit
    submit(s, "a", now=now)
    (d,) = s.schedule(now)
    assert d.request is starved  # skipped `limit` times: placed now, hit or miss


def test_local_queue_is_served_before_the_global_queue():
    s = LALBScheduler(cluster(2), MODELS, o3_limit=25)
    occupy(s, 0, "a", busy_for=1.0)
    (local,) = submit(s, "a")
    assert s.schedule(0.0) == []  # idle unit 1: waiting 1 s for unit 0 beats a 3 s load
    assert list(s.units[0].local_queue) == [local]
    occupy(s, 1, "c", busy_for=50.0)
    cache(s, 0, "b")
    submit(s, "b")  # a hit on unit 0 too, but it is in the global queue
    s.complete(0, 1.0)
    (d,) = s.schedule(1.0)
    assert d.request is local and d.unit == 0


def test_lb_takes_the_head_whatever_is_cached():
    s = LBScheduler(cluster(2), MODELS)
    cache(s, 1, "b")
    first, second = submit(s, "a", "b")
    ds = s.schedule(0.0)
    assert [d.request for d in ds] == [first, second]
    assert [d.unit for d in ds] == [0, 1]
    assert ds[1].hit and not ds[0].hit


def test_eviction_follows_lru_and_updates_the_holders_index():
    s = LALBScheduler(cluster(1, memory=6000), MODELS, o3_limit=0)
    cache(s, 0, "a", "b")
    s.units[0].cache.touch("a")  # b is now the least recently used
    submit(s, "c")
    (d,) = s.schedule(0.0)
    assert d.evicted == ("b",)
    assert s.holders["b"] == set() and s.holders["c"] == {0} and s.holders["a"] == {0}


def test_model_bigger_than_every_unit_is_refused():
    with pytest.raises(PlacementError, match="exceeds every unit"):
        LALBScheduler(cluster(2, memory=1000), MODELS)
    s = LALBScheduler(cluster(1), MODELS)
    with pytest.raises(PlacementError, match="not in the catalog"):
        s.submit(Request(1, "zzz", 0.0), 0.0)
    with pytest.raises(PlacementError, match="o3_limit"):
        LALBScheduler(cluster(1), MODELS, o3_limit=-1)
