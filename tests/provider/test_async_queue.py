"""The async queue's contract on both back ends: embedded (SQLite) and Redis Streams (real redis)."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from faas_gpu.async_queue import (
    EmbeddedQueue,
    QueueStorageFull,
    QueueUnavailable,
    RedisStreamQueue,
    open_queue,
)
from tests.disk_full import fill, tmpfs
from tests.servers import RedisServer


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


# -- once per call (issue 42) ----------------------------------------------------------------------
def test_a_call_put_again_under_its_key_is_not_queued_twice(make_queue):
    q = make_queue()
    first = q.put({"Function": "f", "n": 1}, key="k1")
    assert q.put({"Function": "f", "n": 2}, key="k1") == first
    assert q.pending_count() == 1
    d = q.claim("c", block_ms=100)
    assert d is not None and d.message["n"] == 1 and d.key == "k1"
    assert not q.is_done("k1")
    q.finish(d.id, d.key)
    assert q.is_done("k1") and q.pending_count() == 0
    q.put({"Function": "f", "n": 3}, key="k1")  # a resend after it ran: nothing to run
    assert q.pending_count() == 0
    q.put({"Function": "f", "n": 4}, key="k2")
    assert q.pending_count() == 1


def test_a_redelivered_call_keeps_its_key_and_a_renewed_claim_is_not_redelivered(make_queue):
    q = make_queue(visibility_s=0.6)
    q.put({"Function": "f"}, key="k-crash")
    first = q.claim("dead-consumer", block_ms=100)
    assert first is not None
    q.close()
    q2 = make_queue(visibility_s=0.6)
    again = None
    for _ in range(10):
        again = q2.claim("new-process", block_ms=500)
        if again:
            break
    assert again is not None and again.key == "k-crash" and not q2.is_done("k-crash")
    for _ in range(4):  # held past its visibility timeout, renewed meanwhile: nobody else gets it
        q2.touch([again.id], "new-process")
        assert q2.claim("other", block_ms=300) is None
    q2.finish(again.id, again.key)
    assert q2.is_done("k-crash") and q2.pending_count() == 0


def test_a_put_gives_up_within_a_second_while_redis_does_not_answer_and_is_not_applied_later(tmp_path):
    """Issue 42: Redis SIGSTOPped (it accepts connections and answers nothing). Before, the put
    retried for minutes; now it fails at once, and Redis, resumed, does not apply it behind the
    caller's back (the put carried a deadline)."""
    server = RedisServer(tmp_path)
    server.start()
    q = RedisStreamQueue(server.url, stream="faas-gpu:stopped")
    try:
        q.put({"Function": "before"}, key="k0")
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(QueueUnavailable, match="async queue: Redis at 127.0.0.1:"):
                q.put({"Function": "during"}, key="k1")
            took = time.monotonic() - t0
            time.sleep(0.5)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert took < 5, took
        assert q.pending_count() == 1, "the put the caller was told failed was applied later"
        assert q.put({"Function": "after"}, key="k1") and q.pending_count() == 2  # the retry is taken
    finally:
        q.close()
        server.stop()


# -- a full disk (issue 42) ---------------------------------------------------------------------------
@pytest.fixture
def tiny_disk(tmp_path):
    with tmpfs(tmp_path / "tiny", "2m") as folder:
        yield folder


def test_a_full_disk_refuses_new_work_naming_the_folder_and_keeps_what_it_accepted(tiny_disk):
    q = EmbeddedQueue(tiny_disk / "queue.db")
    try:
        accepted = [q.put({"Function": "f", "n": i}, key=f"k{i}") for i in range(5)]
        filler = fill(tiny_disk)
        with pytest.raises(QueueStorageFull) as err:
            for i in range(5, 5000):  # the journal's free pages may take a few more first
                accepted.append(q.put({"Function": "f", "n": i, "pad": "x" * 4096}, key=f"k{i}"))
        assert f"the state folder {tiny_disk} is full" in str(err.value)
        filler.unlink()
        got = []
        while (d := q.claim("c", block_ms=100)) is not None:
            got.append(d.id)
            q.finish(d.id, d.key)
        assert got == accepted, "work accepted before the disk filled was lost"
        assert q.put({"Function": "f"}, key="after") and q.pending_count() == 1
    finally:
        q.close()
