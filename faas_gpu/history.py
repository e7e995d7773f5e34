"""Invocation history for the keep-alive policies: which minutes each function was called in.

LSTH needs the idle times of the last 24 hours, across provider restarts and shared by every
gateway replica, so the history lives in Redis (a sorted set per function, minute -> minute)
when the stack has one, and in a SQLite file otherwise. Recording is deduplicated per minute
in memory: the hot path pays one dictionary lookup, and the store one write a minute per
function.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from abc import ABC, abstractmethod
from pathlib import Path

import redis

from faas_gpu.credentials import Login, redis_login

log = logging.getLogger(__name__)
RETAIN_MINUTES = 25 * 60  # LSTH's long window (24 h) plus an hour of slack
KEY_PREFIX = "faas-gpu:invocations:"


class InvocationHistory(ABC):
    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, function: str, now_s: float) -> None:
        minute = int(now_s // 60)
        with self._lock:
            if self._last.get(function) == minute:
                return
            self._last[function] = minute
        try:
            self._add(function, minute)
        except (redis.RedisError, sqlite3.Error, OSError):  # a peer restarting must not fail invocations
            log.warning("invocation history unavailable; minute %d of %s not recorded", minute, function)
            with self._lock:
                self._last.pop(function, None)

    def active_minutes(self, function: str, since_minute: int) -> list[int]:
        """Sorted minutes (since the epoch) with at least one invocation, from `since_minute` on."""
        return self._range(function, since_minute)

    def forget(self, function: str) -> None:
        with self._lock:
            self._last.pop(function, None)
        self._delete(function)

    @abstractmethod
    def _add(self, function: str, minute: int) -> None: ...

    @abstractmethod
    def _range(self, function: str, since_minute: int) -> list[int]: ...

    @abstractmethod
    def _delete(self, function: str) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class EmbeddedHistory(InvocationHistory):
    def __init__(self, path: Path | str):
        super().__init__()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS invocations (function TEXT, minute INTEGER, PRIMARY KEY (function, minute))"
        )
        self._db_lock = threading.Lock()

    def _add(self, function: str, minute: int) -> None:
        with self._db_lock:
            self._db.execute("INSERT OR IGNORE INTO invocations VALUES (?, ?)", (function, minute))
            self._db.execute(
                "DELETE FROM invocations WHERE function = ? AND minute < ?", (function, minute - RETAIN_MINUTES)
            )

    def _range(self, function: str, since_minute: int) -> list[int]:
        with self._db_lock:
            rows = self._db.execute(
                "SELECT minute FROM invocations WHERE function = ? AND minute >= ? ORDER BY minute",
                (function, since_minute),
            ).fetchall()
        return [m for (m,) in rows]

    def _delete(self, function: str) -> None:
        with self._db_lock:
            self._db.execute("DELETE FROM invocations WHERE function = ?", (function,))

    def close(self) -> None:
        self._db.close()


class RedisHistory(InvocationHistory):
    def __init__(self, url: str, login: Login | None = None):
        super().__init__()
        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2, **redis_login(url, login))

    def _add(self, function: str, minute: int) -> None:
        key = KEY_PREFIX + function
        pipe = self._redis.pipeline()
        pipe.zadd(key, {str(minute): minute})
        pipe.zremrangebyscore(key, "-inf", minute - RETAIN_MINUTES)
        pipe.execute()

    def _range(self, function: str, since_minute: int) -> list[int]:
        return [int(m) for m in self._redis.zrangebyscore(KEY_PREFIX + function, since_minute, "+inf")]

    def _delete(self, function: str) -> None:
        self._redis.delete(KEY_PREFIX + function)

    def close(self) -> None:
        self._redis.close()


def open_history(redis_url: str | None, path: Path, login: Login | None = None) -> InvocationHistory:
    return RedisHistory(redis_url, login) if redis_url else EmbeddedHistory(path)
