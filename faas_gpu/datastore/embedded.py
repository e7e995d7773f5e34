"""The embedded datastore: etcd's model in-process, persisted to one SQLite file.

The single-node default. Every write bumps one global revision, as in etcd, and is recorded
in a bounded history so that a watch can start from a past revision.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from .base import KV, Datastore, DatastoreFull, DatastoreUnavailable, Event, Lease, Watch, lease_id, to_bytes

P = ParamSpec("P")
R = TypeVar("R")

HISTORY_KEEP = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value BLOB NOT NULL, create_rev INTEGER NOT NULL,
    mod_rev INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS history (rev INTEGER PRIMARY KEY, type TEXT NOT NULL, key TEXT NOT NULL, value BLOB);
"""


def _unavailable_on_sqlite_error(method: Callable[P, R]) -> Callable[P, R]:
    """SQLite failing (disk full or gone, a file locked past its timeout) is the store being
    unavailable, the same typed error the etcd back end raises, so callers handle one error. A full
    disk is `DatastoreFull`, naming the folder (the state folder: `paths.state_db`): the transaction
    was rolled back, so nothing stored before is lost."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc):
                folder = getattr(args[0], "path", Path("?")).parent
                raise DatastoreFull(
                    f"the state folder {folder} is out of disk space: the datastore (embedded SQLite) cannot "
                    f"write ({exc}); nothing was changed, and what it held is kept: free space there, then retry"
                ) from exc
            raise DatastoreUnavailable(f"datastore (embedded SQLite) is unavailable: {exc}") from exc

    return wrapper


def _prefix_end(prefix: str) -> str:
    return prefix + "\U0010ffff"


class EmbeddedLease(Lease):
    def __init__(self, store: EmbeddedDatastore, id_: int, ttl: int):
        self.store, self.id, self.ttl = store, id_, ttl

    def refresh(self) -> None:
        self.store._refresh_lease(self.id)

    def revoke(self) -> None:
        self.store._revoke_lease(self.id)


class EmbeddedDatastore(Datastore):
    def __init__(self, path: Path | str, reap_every_s: float = 0.2):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('revision', 1)")
        self._lock = threading.RLock()
        self._watches: list[tuple[str, Watch]] = []
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, args=(reap_every_s,), daemon=True)
        self._reaper.start()

    # -- helpers -------------------------------------------------------------------------
    def _revision(self) -> int:
        return self._db.execute("SELECT value FROM meta WHERE name='revision'").fetchone()[0]

    def _bump(self) -> int:
        rev = self._revision() + 1
        self._db.execute("UPDATE meta SET value=? WHERE name='revision'", (rev,))
        return rev

    def _record(self, event: Event) -> None:
        self._db.execute(
            "INSERT INTO history VALUES (?,?,?,?)", (event.mod_revision, event.type, event.key, event.value)
        )
        if event.mod_revision % 1000 == 0:
            self._db.execute("DELETE FROM history WHERE rev <= ?", (event.mod_revision - HISTORY_KEEP,))
        for prefix, watch in list(self._watches):
            if event.key.startswith(prefix):
                watch._deliver(event)

    @staticmethod
    def _kv(row) -> KV:
        return KV(row[0], bytes(row[1]), row[2], row[3], row[4], row[5])

    def _tx(self):
        return _Tx(self)

    # -- reads ---------------------------------------------------------------------------
    @_unavailable_on_sqlite_error
    def get(self, key: str) -> KV | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM kv WHERE key=?", (key,)).fetchone()
        return self._kv(row) if row else None

    @_unavailable_on_sqlite_error
    def get_prefix(self, prefix: str) -> list[KV]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM kv WHERE key >= ? AND key < ? ORDER BY key", (prefix, _prefix_end(prefix))
            ).fetchall()
        return [self._kv(r) for r in rows]

    # -- writes --------------------------------------------------------------------------
    def _put_locked(self, key: str, value: bytes, lease: int | None) -> int:
        if lease is not None and not self._db.execute("SELECT 1 FROM leases WHERE id=?", (lease,)).fetchone():
            raise ValueError(f"lease: {lease} does not exist")
        rev = self._bump()
        row = self._db.execute("SELECT create_rev, version FROM kv WHERE key=?", (key,)).fetchone()
        create_rev, version = (row[0], row[1] + 1) if row else (rev, 1)
        self._db.execute(
            "INSERT OR REPLACE INTO kv VALUES (?,?,?,?,?,?)", (key, value, create_rev, rev, version, lease)
        )
        self._record(Event("put", key, value, rev))
        return rev

    def _delete_locked(self, keys: list[str]) -> int:
        for key in keys:
            rev = self._bump()
            self._db.execute("DELETE FROM kv WHERE key=?", (key,))
            self._record(Event("delete", key, None, rev))
        return len(keys)

    @_unavailable_on_sqlite_error
    def put(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> int:
        with self._lock, self._tx():
            return self._put_locked(key, to_bytes(value), lease_id(lease))

    @_unavailable_on_sqlite_error
    def delete(self, key: str) -> bool:
        with self._lock, self._tx():
            exists = self._db.execute("SELECT 1 FROM kv WHERE key=?", (key,)).fetchone()
            return bool(exists) and self._delete_locked([key]) == 1

    @_unavailable_on_sqlite_error
    def delete_prefix(self, prefix: str) -> int:
        with self._lock, self._tx():
            keys = [
                r[0]
                for r in self._db.execute(
                    "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key", (prefix, _prefix_end(prefix))
                )
            ]
            return self._delete_locked(keys)

    @_unavailable_on_sqlite_error
    def create(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> bool:
        with self._lock, self._tx():
            if self._db.execute("SELECT 1 FROM kv WHERE key=?", (key,)).fetchone():
                return False
            self._put_locked(key, to_bytes(value), lease_id(lease))
            return True

    @_unavailable_on_sqlite_error
    def _compare_and_swap(
        self, key: str, new_value: bytes, expected_value: bytes | None, expected_mod_revision: int | None
    ) -> bool:
        with self._lock, self._tx():
            row = self._db.execute("SELECT value, mod_rev FROM kv WHERE key=?", (key,)).fetchone()
            if row is None:
                return False
            if expected_value is not None and bytes(row[0]) != expected_value:
                return False
            if expected_mod_revision is not None and row[1] != expected_mod_revision:
                return False
            lease = self._db.execute("SELECT lease FROM kv WHERE key=?", (key,)).fetchone()[0]
            self._put_locked(key, new_value, lease)
            return True

    # -- leases --------------------------------------------------------------------------
    @_unavailable_on_sqlite_error
    def lease(self, ttl_s: int) -> Lease:
        with self._lock, self._tx():
            cur = self._db.execute("INSERT INTO leases (ttl, expires) VALUES (?, ?)", (ttl_s, time.time() + ttl_s))
            return EmbeddedLease(self, cur.lastrowid, ttl_s)

    @_unavailable_on_sqlite_error
    def _refresh_lease(self, lid: int) -> None:
        with self._lock, self._tx():
            cur = self._db.execute("UPDATE leases SET expires = ? + ttl WHERE id=?", (time.time(), lid))
            if cur.rowcount == 0:
                raise ValueError(f"lease: {lid} has expired or does not exist")

    @_unavailable_on_sqlite_error
    def _revoke_lease(self, lid: int) -> None:
        with self._lock, self._tx():
            keys = [r[0] for r in self._db.execute("SELECT key FROM kv WHERE lease=? ORDER BY key", (lid,))]
            self._delete_locked(keys)
            self._db.execute("DELETE FROM leases WHERE id=?", (lid,))

    def _reap(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            with self._lock:
                if self._closed.is_set():
                    return
                expired = [r[0] for r in self._db.execute("SELECT id FROM leases WHERE expires < ?", (time.time(),))]
            for lid in expired:
                self._revoke_lease(lid)

    # -- watches -------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        entry: tuple[str, Watch]

        def cancel() -> None:
            with self._lock:
                if entry in self._watches:
                    self._watches.remove(entry)

        watch = Watch(cancel)
        entry = (prefix, watch)
        with self._lock:
            if start_revision is not None:
                rows = self._db.execute(
                    "SELECT rev, type, key, value FROM history WHERE rev >= ? AND key >= ? AND key < ? ORDER BY rev",
                    (start_revision, prefix, _prefix_end(prefix)),
                ).fetchall()
                for rev, typ, key, value in rows:
                    watch._deliver(Event(typ, key, bytes(value) if value is not None else None, rev))
            self._watches.append(entry)
        return watch

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for _prefix, watch in list(self._watches):
                watch.cancel()
            self._db.close()


class _Tx:
    """One SQLite transaction per datastore operation: a crash never leaves half a write."""

    def __init__(self, store: EmbeddedDatastore):
        self.db = store._db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, *_):
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False
