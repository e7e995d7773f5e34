"""The async invocation queue: embedded (SQLite) by default, Redis Streams with `--redis`.

Delivery is at least once: a message stays pending until acked, and a claim that is not acked
within the visibility timeout (a consumer that crashed) is delivered again — so work accepted
with 202 survives a provider restart. A consumer that holds a message longer (its callback
waits its turn) renews its claim (`touch`).

Once, not twice (issue 42): each call is put under a key (its function and `X-Call-Id`) that
the back end remembers for `dedupe_ttl_s`. A caller that sends the same call again (it lost the
202, or got a 503 and retries with the call id it was given) gets the call it already has, not a
second run; `finish` marks the call done in the same step as it acks the message, and a done
call's message, should it come back, is not run again.

Failing fast where a caller waits: a put on Redis gives up within a second (`put_timeout_s`)
and raises `QueueUnavailable` — the gateway answers 503, never a hang while Redis does not answer
(stopped, SIGSTOPped, partitioned). Redis only applies a put that reaches it before the put's
deadline (its own clock, offset measured), so a put the gateway gave up on is not run later
behind the caller's back. The embedded queue on a full disk raises `QueueStorageFull` (507)
naming the state folder; what it had accepted stays.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from faas_gpu.credentials import Login, redis_login, split_login

DEFAULT_VISIBILITY_S = 30.0
DEDUPE_TTL_S = 3600.0
"""How long a call's key is remembered: a retry of the same call within it is not run again.
An hour covers a caller's retries and a gateway's restart many times over (NATS JetStream, the
queue of OpenFaaS Pro, dedupes over 2 minutes by default); a key costs ~150 bytes in Redis."""
PUT_TIMEOUT_S = 0.9
"""The longest a put waits for Redis (the gateway's caller is waiting: a 503 rather than a hang)."""


class QueueUnavailable(Exception):
    """The queue could not take the message now (answered 503); nothing was queued."""


class QueueStorageFull(QueueUnavailable):
    """The embedded queue's disk is full (answered 507); nothing was queued, nothing accepted is lost."""


@dataclass(frozen=True)
class Delivery:
    id: str
    message: dict
    key: str | None = None
    """The call's key (`call_key`), None for a message put without one."""


def call_key(namespace: str, name: str, call_id: str) -> str:
    """The key that makes a call the same call: its function and `X-Call-Id` (hashed: a call id
    is the caller's text, of any length)."""
    return hashlib.sha256(f"{namespace}\0{name}\0{call_id}".encode()).hexdigest()


def _encode(message: object) -> str:
    if not isinstance(message, dict):
        raise ValueError("message: must be a JSON object (an OpenFaaS QueueRequest)")
    return json.dumps(message)


class AsyncQueue(ABC):
    @abstractmethod
    def put(self, message: dict, key: str | None = None) -> str:
        """Queue `message`; under `key`, a call already queued or done under it is not queued again
        (its id is returned). QueueUnavailable (QueueStorageFull) when it cannot be taken now."""

    @abstractmethod
    def claim(self, consumer: str, block_ms: int = 1000) -> Delivery | None:
        """The next message for this consumer, or None after `block_ms`."""

    @abstractmethod
    def ack(self, delivery_id: str) -> None: ...

    @abstractmethod
    def finish(self, delivery_id: str, key: str | None) -> None:
        """The call is done: its key marked done and its message acked, in one step."""

    @abstractmethod
    def is_done(self, key: str) -> bool:
        """Whether the call under `key` was finished (within the dedupe TTL)."""

    @abstractmethod
    def touch(self, delivery_ids: Iterable[str], consumer: str) -> None:
        """Renew this consumer's claim of messages it still holds (not redelivered for another
        visibility timeout)."""

    @abstractmethod
    def pending_count(self) -> int:
        """Messages accepted and not yet acked."""

    @abstractmethod
    def close(self) -> None: ...


def _is_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(exc)


class EmbeddedQueue(AsyncQueue):
    """SQLite-backed; a queue opened on the same file after a restart redelivers unacked work."""

    def __init__(
        self,
        path: Path | str,
        visibility_timeout_s: float = DEFAULT_VISIBILITY_S,
        dedupe_ttl_s: float = DEDUPE_TTL_S,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.visibility_s = visibility_timeout_s
        self.dedupe_ttl_s = dedupe_ttl_s
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=1.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL,"
            " claimed_until REAL NOT NULL DEFAULT 0, consumer TEXT)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(queue)")}
        if "call_key" not in columns:  # a queue file from before call keys
            self._db.execute("ALTER TABLE queue ADD COLUMN call_key TEXT")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, state TEXT NOT NULL, queue_id INTEGER,"
            " expires REAL NOT NULL)"
        )
        # a new queue object means a new process: what the old one had claimed is free again
        self._db.execute("UPDATE queue SET claimed_until = 0, consumer = NULL")
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._purged = 0.0

    def _full(self, exc: sqlite3.Error) -> QueueUnavailable:
        if _is_full(exc):
            return QueueStorageFull(
                f"async queue: the state folder {self.path.parent} is full ({exc}); free space there, then retry"
            )
        return QueueUnavailable(f"async queue ({self.path}): {exc}")

    def _write(self, op):
        """`op` in one transaction (the lock held); a failure rolls back and is QueueUnavailable."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = op()
                self._db.execute("COMMIT")
                return out
            except BaseException:
                if self._db.in_transaction:  # sqlite rolls back by itself after some failures (a full disk)
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
        except sqlite3.Error as exc:
            raise self._full(exc) from exc

    def put(self, message: dict, key: str | None = None) -> str:
        body = _encode(message)
        now = time.time()

        def op() -> str:
            if key is not None:
                row = self._db.execute(
                    "SELECT queue_id FROM calls WHERE key = ? AND expires > ?", (key, now)
                ).fetchone()
                if row is not None:
                    return str(row[0])
            cur = self._db.execute("INSERT INTO queue (body, call_key) VALUES (?, ?)", (body, key))
            if key is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO calls (key, state, queue_id, expires) VALUES (?, 'queued', ?, ?)",
                    (key, cur.lastrowid, now + self.dedupe_ttl_s),
                )
            return str(cur.lastrowid)

        with self._ready:
            if now - self._purged > 60:
                self._purged = now
                try:
                    self._write(lambda: self._db.execute("DELETE FROM calls WHERE expires <= ?", (now,)))
                except QueueUnavailable:
                    pass  # a full disk: the put below says so
            msg_id = self._write(op)
            self._ready.notify()
            return msg_id

    def claim(self, consumer: str, block_ms: int = 1000) -> Delivery | None:
        deadline = time.monotonic() + block_ms / 1000
        with self._ready:
            while True:
                now = time.time()
                row = self._db.execute(
                    "SELECT id, body, call_key FROM queue WHERE claimed_until < ? ORDER BY id LIMIT 1", (now,)
                ).fetchone()
                if row:
                    claim = (now + self.visibility_s, consumer, row[0])
                    self._write(
                        lambda claim=claim: self._db.execute(
                            "UPDATE queue SET claimed_until = ?, consumer = ? WHERE id = ?", claim
                        )
                    )
                    return Delivery(str(row[0]), json.loads(row[1]), row[2])
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._ready.wait(min(left, 0.5))

    def ack(self, delivery_id: str) -> None:
        with self._lock:
            self._write(lambda: self._db.execute("DELETE FROM queue WHERE id = ?", (int(delivery_id),)))

    def finish(self, delivery_id: str, key: str | None) -> None:
        def op() -> None:
            if key is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO calls (key, state, queue_id, expires) VALUES (?, 'done', ?, ?)",
                    (key, int(delivery_id), time.time() + self.dedupe_ttl_s),
                )
            self._db.execute("DELETE FROM queue WHERE id = ?", (int(delivery_id),))

        with self._lock:
            self._write(op)

    def is_done(self, key: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM calls WHERE key = ? AND state = 'done' AND expires > ?", (key, time.time())
            ).fetchone()
            return row is not None

    def touch(self, delivery_ids: Iterable[str], consumer: str) -> None:
        ids = [int(i) for i in delivery_ids]
        if not ids:
            return
        until = time.time() + self.visibility_s
        with self._lock:
            self._write(
                lambda: self._db.executemany(
                    "UPDATE queue SET claimed_until = ?, consumer = ? WHERE id = ?", [(until, consumer, i) for i in ids]
                )
            )

    def pending_count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM queue").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


# Put under a key, only before the deadline (Redis's clock, in ms): 'late' (not applied), 'dup'
# (the id the key already has) or 'ok' with the new id. The key's value is the message's id.
_PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(ARGV[3]) > 0 and now > tonumber(ARGV[3]) then return {'late', ''} end
if KEYS[2] ~= nil then
  local had = redis.call('GET', KEYS[2])
  if had then return {'dup', had} end
end
local id = redis.call('XADD', KEYS[1], '*', 'body', ARGV[1], 'key', ARGV[4])
if KEYS[2] ~= nil then redis.call('SET', KEYS[2], id, 'EX', ARGV[2]) end
return {'ok', id}
"""
_DONE = b"done"


class RedisStreamQueue(AsyncQueue):
    """A Redis Stream with one consumer group; XAUTOCLAIM takes over a dead consumer's work."""

    def __init__(
        self,
        url: str,
        stream: str = "faas-gpu:queue",
        group: str = "faas-gpu",
        visibility_timeout_s: float = DEFAULT_VISIBILITY_S,
        dedupe_ttl_s: float = DEDUPE_TTL_S,
        put_timeout_s: float = PUT_TIMEOUT_S,
        login: Login | None = None,
    ):
        self.url = url
        auth = redis_login(url, login)
        self.redis = redis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=10, **auth
        )
        # the caller's path: one short try (a fresh connection once), no library retries behind it
        attempt_s = put_timeout_s / 2
        self._put_redis = redis.Redis.from_url(
            url, socket_timeout=attempt_s, socket_connect_timeout=attempt_s, retry=Retry(NoBackoff(), 0), **auth
        )
        self._put_script = self._put_redis.register_script(_PUT)
        self.put_timeout_s = put_timeout_s
        self.stream, self.group = stream, group
        self.visibility_s = visibility_timeout_s
        self.visibility_ms = int(visibility_timeout_s * 1000)
        self.dedupe_ttl_s = dedupe_ttl_s
        self._group_ready = False
        self._offset_ms: float | None = None  # Redis's clock minus ours
        self._offset_at = 0.0

    def _key(self, key: str) -> str:
        return f"{self.stream}:call:{key}"

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

    def _redis_offset_ms(self) -> float:
        """Redis's clock minus ours, in ms (measured at most once a minute, to ±half a round trip)."""
        if self._offset_ms is None or time.monotonic() - self._offset_at > 60:
            t0 = time.time()
            seconds, micros = self._put_redis.time()
            t1 = time.time()
            self._offset_ms = seconds * 1000 + micros / 1000 - (t0 + t1) * 500
            self._offset_at = time.monotonic()
        return self._offset_ms

    def put(self, message: dict, key: str | None = None) -> str:
        body = _encode(message)
        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                # applied only if it reaches Redis well before we stop waiting for its answer
                deadline_ms = time.time() * 1000 + self._redis_offset_ms() + self.put_timeout_s * 1000 / 3
                keys = [self.stream] + ([self._key(key)] if key is not None else [])
                args = [body, int(self.dedupe_ttl_s), int(deadline_ms), key or ""]
                verdict, msg_id = self._put_script(keys=keys, args=args)
            except redis.TimeoutError as exc:
                raise QueueUnavailable(
                    f"async queue: Redis at {self._where()} did not answer ({exc}); retry later"
                ) from exc
            except redis.ConnectionError as exc:
                # a pooled connection from before a Redis restart fails at once: one fresh try
                if attempts == 1 and time.monotonic() - start < self.put_timeout_s / 2:
                    continue
                raise QueueUnavailable(
                    f"async queue: cannot reach Redis at {self._where()} ({exc}); retry later"
                ) from exc
            except redis.RedisError as exc:
                raise QueueUnavailable(f"async queue: Redis at {self._where()} refused the message ({exc})") from exc
            verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
            if verdict == "late":
                self._offset_ms = None  # measure again: a slow Redis, or a clock that moved
                raise QueueUnavailable(f"async queue: Redis at {self._where()} answered too late; retry later")
            return msg_id.decode() if isinstance(msg_id, bytes) else msg_id

    def _where(self) -> str:
        kwargs = self._put_redis.connection_pool.connection_kwargs
        if "path" in kwargs:
            return kwargs["path"]
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"

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
                key = (fields.get(b"key") or b"").decode() or None
                return Delivery(mid, json.loads(fields[b"body"]), key)
            return None

        return self._with_retry(op)

    def ack(self, delivery_id: str) -> None:
        def op() -> None:
            pipe = self.redis.pipeline()
            pipe.xack(self.stream, self.group, delivery_id)
            pipe.xdel(self.stream, delivery_id)
            pipe.execute()

        self._with_retry(op)

    def finish(self, delivery_id: str, key: str | None) -> None:
        def op() -> None:
            pipe = self.redis.pipeline()  # MULTI/EXEC: marked done and acked together, or neither
            if key is not None:
                pipe.set(self._key(key), _DONE, ex=int(self.dedupe_ttl_s))
            pipe.xack(self.stream, self.group, delivery_id)
            pipe.xdel(self.stream, delivery_id)
            pipe.execute()

        self._with_retry(op)

    def is_done(self, key: str) -> bool:
        return self._with_retry(lambda: self.redis.get(self._key(key))) == _DONE

    def touch(self, delivery_ids: Iterable[str], consumer: str) -> None:
        ids = list(delivery_ids)
        if ids:
            self._with_retry(lambda: self.redis.xclaim(self.stream, self.group, consumer, 0, ids, justid=True))

    def pending_count(self) -> int:
        return self._with_retry(lambda: self.redis.xlen(self.stream))

    def close(self) -> None:
        self.redis.close()
        self._put_redis.close()


def open_queue(url: str | None, path: Path, login: Login | None = None) -> AsyncQueue:
    """`login`: Redis's ACL user (else the URL's userinfo); `faas_gpu.credentials.resolve_login`."""
    if not url:
        return EmbeddedQueue(path)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStreamQueue(url, login=login)
    raise ValueError(f"redis URL: {split_login(url)[0]!r} must start with redis://, rediss:// or unix://")
