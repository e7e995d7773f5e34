"""The async queue's contract on both back ends: embedded (SQLite) and Redis Streams (real redis)."""

from __future__ import annotations

import uuid

import pytest

from faas_gpu.async_queue import EmbeddedQueue, RedisStreamQueue, open_queue


@pytest.fixture(params=["embedded", "redis"])
def make_queue(request, tmp_path):
    """A factory: calling it again opens the same queue anew, as a restarted provider would."""
    opened = []
    stream = f"faas-gpu:test:{uuid.uuid4().hex[:8]}"

    def make(visibility_s: float = 30.0):
        if request.param == "embedded":
            q = EmbeddedQueue(tmp_path / "queue.db", visibility_timeout_s=visibility_s)
        else:
            url = request.getfixturevalue("redis_server").url
            q = RedisStreamQueue(url, stream=stream, visibility_timeout_s=visibility_s)
        opened.append(q)
        return q

    yield make
    for q in opened:
        q.close()


def test_put_claim_ack_in_order(make_queue):
    q = make_queue()
    ids = [q.put({"Function": f"f{i}", "Body": ""}) for i in range(3)]
    assert len(set(ids)) == 3 and q.pending_count() == 3
    got = [q.claim("c1", block_ms=100) for _ in range(3)]
    assert [d.message["Function"] for d in got] == ["f0", "f1", "f2"]
    assert q.claim("c1", block_ms=100) is None
    for d in got:
        q.ack(d.id)
    assert q.pending_count() == 0


def test_unacked_claim_is_redelivered_after_visibility_timeout(make_queue):
    q = make_queue(visibility_s=0.3)
    q.put({"Function": "f"})
    first = q.claim("dead-consumer", block_ms=100)
    assert first is not None
    again = q.claim("other", block_ms=1500)
    while again is None:  # redis: XAUTOCLAIM only after min-idle-time
        again = q.claim("other", block_ms=500)
    assert again.message == first.message
    q.ack(again.id)
    assert q.pending_count() == 0


def test_work_survives_a_consumer_restart(make_queue):
    q = make_queue(visibility_s=0.5)
    q.put({"Function": "keep-me"})
    assert q.claim("old-process", block_ms=100) is not None  # claimed, then the process dies
    q.close()
    q2 = make_queue(visibility_s=0.5)
    d = None
    for _ in range(10):
        d = q2.claim("new-process", block_ms=500)
        if d:
            break
    assert d is not None and d.message == {"Function": "keep-me"}
    q2.ack(d.id)


def test_bad_message_is_refused(make_queue):
    q = make_queue()
    with pytest.raises(ValueError, match="message"):
        q.put(["not", "a", "dict"])  # type: ignore[arg-type]


def test_redis_queue_survives_a_redis_restart(redis_server):
    q = RedisStreamQueue(redis_server.url, stream=f"faas-gpu:test:{uuid.uuid4().hex[:8]}")
    try:
        q.put({"Function": "durable"})
        redis_server.restart()
        d = q.claim("c", block_ms=500)
        assert d is not None and d.message == {"Function": "durable"}
        q.ack(d.id)
    finally:
        q.close()


def test_open_queue_chooses_back_end(tmp_path):
    q = open_queue(None, tmp_path / "q.db")
    assert isinstance(q, EmbeddedQueue)
    q.close()
    with pytest.raises(ValueError, match="redis URL"):
        open_queue("http://nope", tmp_path / "q.db")
