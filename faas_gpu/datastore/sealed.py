"""The daemons' view of the datastore: every value sealed on write, checked on read.

Why a wrapper around both back ends and not a check in each reader: a record is acted upon in many
places (the provider's function store, the scheduler's unit view, the credential resolver, the
scheduler directory, cordons, leader election, autoscaler plans), and a reader that forgot the
check would be the hole. Through `SealedDatastore` none can forget: a value whose MAC fails
(`faas_gpu.contract.records`) reads as absent (`get` -> None, left out of `get_prefix`, a watch
event becomes a delete), so nothing is started, routed or trusted from it.

Such a record is *quarantined*, not deleted: it stays in the store for the operator to look at
(`faas-gpu datastore check`), it is logged once per key and revision with why, and `quarantined()`
lists what this process has met. A daemon's own write to the key (a redeploy) replaces it; the
operator removes it with `faas-gpu remove` / `faas-gpu datastore check --delete`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from faas_gpu.contract import records

from .base import KV, Datastore, Event, Lease, Watch, to_bytes

log = logging.getLogger(__name__)
MAX_QUARANTINED = 10_000
"""Keys remembered as quarantined (the oldest forgotten past it): a flood of forged keys must not
grow a daemon's memory without bound."""


@dataclass(frozen=True)
class Quarantined:
    key: str
    reason: str  # records.UNSIGNED or records.FORGED
    mod_revision: int
    since: float  # Unix seconds this process first met it


class SealedDatastore(Datastore):
    """`inner` as the daemons see it: values sealed with the cluster's record key."""

    def __init__(self, inner: Datastore, cluster_token: str):
        self.inner = inner
        self._key = records.record_key(cluster_token)
        self._lock = threading.Lock()
        self._quarantined: dict[str, Quarantined] = {}

    # -- the seal ---------------------------------------------------------------------------
    def seal(self, key: str, value: bytes | str) -> bytes:
        return records.seal(self._key, key, to_bytes(value))

    def _open(self, key: str, stored: bytes, mod_revision: int) -> bytes | None:
        """The value, or None after quarantining the record."""
        try:
            value = records.unseal(self._key, key, stored)
        except records.RecordError as exc:
            self._quarantine(key, exc.reason, mod_revision)
            return None
        self._release(key)
        return value

    def _quarantine(self, key: str, reason: str, mod_revision: int) -> None:
        with self._lock:
            seen = self._quarantined.get(key)
            if seen is not None and seen.mod_revision == mod_revision:
                return
            if seen is None and len(self._quarantined) >= MAX_QUARANTINED:
                self._quarantined.pop(next(iter(self._quarantined)))
            self._quarantined[key] = Quarantined(key, reason, mod_revision, seen.since if seen else time.time())
        why = (
            "it has no MAC (written before records were sealed, or by hand: `faas-gpu datastore adopt` "
            "seals such records once the operator trusts them)"
            if reason == records.UNSIGNED
            else "its MAC does not match (not written by this cluster's daemons, or changed since)"
        )
        log.error(
            "quarantined the datastore record %s (revision %d): %s; it is not acted upon", key[:200], mod_revision, why
        )

    def _release(self, key: str) -> None:
        if key in self._quarantined:
            with self._lock:
                if self._quarantined.pop(key, None) is not None:
                    log.info("the datastore record %s is sealed again (rewritten by a daemon)", key[:200])

    def quarantined(self, prefix: str = "") -> list[Quarantined]:
        """The records under `prefix` this process found quarantined on its latest read of each."""
        with self._lock:
            return sorted((q for q in self._quarantined.values() if q.key.startswith(prefix)), key=lambda q: q.key)

    def _kv(self, kv: KV) -> KV | None:
        value = self._open(kv.key, kv.value, kv.mod_revision)
        return None if value is None else dataclasses.replace(kv, value=value)

    # -- reads ------------------------------------------------------------------------------
    def get(self, key: str) -> KV | None:
        kv = self.inner.get(key)
        if kv is None:
            self._release_gone(key)
            return None
        return self._kv(kv)

    def get_prefix(self, prefix: str) -> list[KV]:
        stored = self.inner.get_prefix(prefix)
        present = {kv.key for kv in stored}
        with self._lock:
            gone = [k for k in self._quarantined if k.startswith(prefix) and k not in present]
            for k in gone:
                del self._quarantined[k]
        return [kv for kv in map(self._kv, stored) if kv is not None]

    def _release_gone(self, key: str) -> None:
        if key in self._quarantined:
            with self._lock:
                self._quarantined.pop(key, None)

    # -- writes -----------------------------------------------------------------------------
    def put(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> int:
        return self.inner.put(key, self.seal(key, value), lease)

    def delete(self, key: str) -> bool:
        deleted = self.inner.delete(key)
        self._release_gone(key)
        return deleted

    def delete_prefix(self, prefix: str) -> int:
        deleted = self.inner.delete_prefix(prefix)
        with self._lock:
            for k in [k for k in self._quarantined if k.startswith(prefix)]:
                del self._quarantined[k]
        return deleted

    def create(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> bool:
        return self.inner.create(key, self.seal(key, value), lease)

    def _compare_and_swap(
        self, key: str, new_value: bytes, expected_value: bytes | None, expected_mod_revision: int | None
    ) -> bool:
        expected = None if expected_value is None else self.seal(key, expected_value)
        return self.inner.compare_and_swap(
            key,
            self.seal(key, new_value),
            expected_value=expected,
            expected_mod_revision=expected_mod_revision,
        )

    # -- leases, watches --------------------------------------------------------------------
    def lease(self, ttl_s: int) -> Lease:
        return self.inner.lease(ttl_s)

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        return _SealedWatch(self, self.inner.watch_prefix(prefix, start_revision))

    def close(self) -> None:
        self.inner.close()


class _SealedWatch(Watch):
    """The inner watch's events, opened: a put whose MAC fails is delivered as a delete (the key
    holds nothing a daemon may use, as `get` says), never with its value."""

    def __init__(self, store: SealedDatastore, inner: Watch):
        super().__init__(inner.cancel)
        self._store, self._inner = store, inner

    def _opened(self, event: Event) -> Event:
        if event.type != "put" or event.value is None:
            return event
        value = self._store._open(event.key, event.value, event.mod_revision)
        if value is None:
            return Event("delete", event.key, None, event.mod_revision)
        return dataclasses.replace(event, value=value)

    def get(self, timeout: float | None = None) -> Event | None:
        event = self._inner.get(timeout)
        return None if event is None else self._opened(event)

    def __iter__(self) -> Iterator[Event]:
        for event in self._inner:
            yield self._opened(event)
