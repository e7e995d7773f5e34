"""The per-unit LRU model cache."""

import pytest

from faas_gpu.policies import ModelCache, ModelTooLarge


def test_lru_victims_until_the_new_model_fits():
    c = ModelCache(10)
    assert c.load("a", 4) == [] and c.load("b", 3) == [] and c.load("c", 3) == []
    c.touch("a")  # order now b, c, a
    assert c.victims_for(5) == ["b", "c"]
    assert c.load("d", 5) == ["b", "c"]
    assert c.models == ["a", "d"] and c.used_mb == 9


def test_reloading_a_cached_model_only_touches_it():
    c = ModelCache(10)
    c.load("a", 5)
    c.load("b", 5)
    assert c.load("a", 5) == []
    assert c.models == ["b", "a"]


def test_model_larger_than_the_unit_is_refused_with_a_reason():
    c = ModelCache(8)
    with pytest.raises(ModelTooLarge, match="9 MB exceeds the unit's 8.0 MB"):
        c.load("huge", 9)
    with pytest.raises(ValueError, match="capacity_mb"):
        ModelCache(0)


def test_a_cache_with_a_model_cap_evicts_the_least_recent_beyond_it_whatever_memory_is_left():
    c = ModelCache(100, max_models=2)
    c.load("a", 1)
    c.load("b", 1)
    assert c.victims_for(1) == ["a"]  # memory for 98 more, room for no third model
    assert c.load("c", 1) == ["a"] and c.models == ["b", "c"]
    assert c.load("c", 1) == []  # a cached model is only touched
    assert ModelCache(100).victims_for(1, max_models=1) == []  # an empty cache has room under any cap
    with pytest.raises(ValueError, match="max_models"):
        ModelCache(10, max_models=0)
