"""The invocation history behind LSTH: embedded (SQLite) and Redis (a real redis-server)."""

import uuid

import pytest

from faas_gpu.history import RETAIN_MINUTES, EmbeddedHistory, RedisHistory
from faas_gpu.policies.infless import LongShortTermHistogram


@pytest.fixture(params=["embedded", "redis"])
def history(request, tmp_path):
    if request.param == "redis":
        h = RedisHistory(request.getfixturevalue("redis_server").url)
    else:
        h = EmbeddedHistory(tmp_path / "history.db")
    yield h
    h.close()


def test_minutes_are_recorded_once_and_read_back_in_order(history):
    fn = f"fn-{uuid.uuid4().hex[:6]}"
    for t in (600.0, 610.0, 659.9, 60.0, 1200.5):
        history.record(fn, t)
    assert history.active_minutes(fn, 0) == [1, 10, 20]
    assert history.active_minutes(fn, 11) == [20]
    assert history.active_minutes("other", 0) == []


def test_old_minutes_are_dropped_past_the_long_window(history):
    fn = f"fn-{uuid.uuid4().hex[:6]}"
    history.record(fn, 0.0)
    history.record(fn, (RETAIN_MINUTES + 5) * 60.0)
    assert history.active_minutes(fn, 0) == [RETAIN_MINUTES + 5]


def test_forget_removes_a_deleted_function(history):
    fn = f"fn-{uuid.uuid4().hex[:6]}"
    history.record(fn, 120.0)
    history.forget(fn)
    assert history.active_minutes(fn, 0) == []


def test_the_embedded_history_survives_a_restart(tmp_path):
    h = EmbeddedHistory(tmp_path / "h.db")
    for m in range(0, 600, 10):
        h.record("fn", m * 60.0)
    h.close()
    again = EmbeddedHistory(tmp_path / "h.db")
    minutes = again.active_minutes("fn", 0)
    assert LongShortTermHistogram().windows(minutes, minutes[-1]).prewarm_s == 9 * 60
    again.close()


def test_recording_survives_a_redis_restart(redis_server):
    h = RedisHistory(redis_server.url)
    fn = f"fn-{uuid.uuid4().hex[:6]}"
    h.record(fn, 60.0)
    redis_server.restart()
    h.record(fn, 120.0)  # may be lost while Redis restarts, but never raises
    h.record(fn, 180.0)
    assert 1 in h.active_minutes(fn, 0) and 3 in h.active_minutes(fn, 0)
    h.close()
