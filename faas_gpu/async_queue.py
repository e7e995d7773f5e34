"""The async invocation queue: embedded (SQLite) by default, Redis Streams with `--redis`.

Delivery is at least once: a message stays pending until acked, and a claim that is not acked
within the visibility timeout (a consumer that crashed) is delivered again — so work accepted
with 202 survives a provider restart.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import redis

from faas_gpu.credentials import Login, redis_login, split_login

DEFAULT_VISIBILITY_S = 30.0


@dataclass(frozen=True)
class Delivery:
    id: str
    message: dict


def _encode(message: object) -> str:
    if not isinstance(message, dict):
        raise ValueError("message: must be a JSON object (an OpenFaaS QueueRequest)")
    return json.dumps(message)


class AsyncQueue(ABC):
    @abstractmethod
    def put(self, message: dict) -> str: ...

    @abstractmethod
    def claim(self, consumer: str, block_ms: int = 1000) -> Delivery | None:
        """The next message for this consumer, or None after `block_ms`."""

    @abstractmethod
    def ack(self, delivery_id: str) -> None: ...

    @abstractmethod
    def pending_count(self) -> int:
        """Messages accepted and not yet acked."""

    @abstractmethod
    def close(self) -> None: ...


class EmbeddedQueue(AsyncQueue):
    """SQLite-backed; a queue opened on the same file after a restart redelivers unacked work."""

    def __init__(self, path: Path | str, visibility_timeout_s: float = DEFAULT_VISIBILITY_S):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.visibility_s = visibility_timeout_s
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL,"
            " claimed_until REAL NOT NULL DEFAULT 0, consumer TEXT)"
        )
        # a new queue object means a new process: what the old one had claimed is free again
        self._db.execute("UPDATE queue SET claimed_until = 0, consumer = NULL")
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)

    def put(self, message: dict) -> str:
        body = _encode(message)
        with self._ready:
            cur = self._db.execute("INSERT INTO queue (body) VALUES (?)", (body,))
            self._ready.notify()
            return str(cur.lastrowid)

    def claim(self, consumer: str, block_ms: int = 1000) -> Delivery | None:
        deadline = time.monotonic() + block_ms / 1000
        with self._ready:
            while True:
                now = time.time()
                row = self._db.execute(
                    "SELECT id, body FROM queue WHERE claimed_until < ? ORDER BY id LIMIT 1", (now,)
                ).fetchone()
                if row:
                    self._db.execute(
                        "UPDATE queue SET claimed_until = ?, consumer = ? WHERE id = ?",
                        (now + self.visibility_s, consumer, row[0]),
                    )
                    return Delivery(str(row[0]), json.loads(row[1]))
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._ready.wait(min(left, 0.5))

    def ack(self, delivery_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM queue WHERE id = ?", (int(delivery_id),))

    def pending_count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM queue").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisStreamQueue(AsyncQueue):
    """A Redis Stream with one consumer group; XAUTOCLAIM takes over a dead consumer's work."""

    def __init__(
        self,
        url: str,
        stream: str = "faas-gpu:queue",
        group: str = "faas-gpu",
        visibility_timeout_s: float = DEFAULT_VISIBILITY_S,
        login: Login | None = None,
    ):
        self.redis = redis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=10, **redis_login(url, login)
        )
        self.stream, self.group = stream, group
        self.visibility_ms = int(visibility_timeout_s * 1000)
        self._group_ready = False

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _with_retry(self, op, retries: int = 20):
        delay = 0.05
        for attempt in range(retries):
            try:
                self._ensure_group()
                return op()
            except (redis.ConnectionError, redis.TimeoutError):
                if attempt == retries - 1:
                    raise
                self._group_ready = False
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc) or attempt == retries - 1:
                    raise
                self._group_ready = False
        raise AssertionError("unreachable")

    def put(self, message: dict) -> str:
        body = _encode(message)
        msg_id = self._with_retry(lambda: self.redis.xadd(self.stream, {"body": body}))
        return msg_id.decode() if isinstance(msg_id, bytes) else msg_id

    def claim(self, consumer: str, block_ms: int = 1000) -> Delivery | None:
        def op() -> Delivery | None:
            _next, claimed, *_ = self.redis.xautoclaim(
                self.stream, self.group, consumer, min_idle_time=self.visibility_ms, start_id="0-0", count=1
            )
            entries = claimed or []
            if not entries:
                got = self.redis.xreadgroup(self.group, consumer, {self.stream: ">"}, count=1, block=block_ms)
                entries = got[0][1] if got else []
            for msg_id, fields in entries:
                if fields is None:  # deleted meanwhile
                    continue
                mid = msg_id.decode() if isinstance(msg_id, bytes) else msg_id
                return Delivery(mid, json.loads(fields[b"body"]))
            return None

        return self._with_retry(op)

    def ack(self, delivery_id: str) -> None:
        def op() -> None:
            pipe = self.redis.pipeline()
            pipe.xack(self.stream, self.group, delivery_id)
            pipe.xdel(self.stream, delivery_id)
            pipe.execute()

        self._with_retry(op)

    def pending_count(self) -> int:
        return self._with_retry(lambda: self.redis.xlen(self.stream))

    def close(self) -> None:
        self.redis.close()


def open_queue(url: str | None, path: Path, login: Login | None = None) -> AsyncQueue:
    """`login`: Redis's ACL user (else the URL's userinfo); `faas_gpu.credentials.resolve_login`."""
    if not url:
        return EmbeddedQueue(path)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStreamQueue(url, login=login)
    raise ValueError(f"redis URL: {split_login(url)[0]!r} must start with redis://, rediss:// or unix://")
