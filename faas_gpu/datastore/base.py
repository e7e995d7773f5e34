"""The datastore interface: etcd's data model (revisions, leases, watches) behind one ABC."""

from __future__ import annotations

import json
import queue
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal


class DatastoreError(Exception):
    pass


class DatastoreUnavailable(DatastoreError):
    """The back end could not be reached after retries."""


class DatastoreFull(DatastoreUnavailable):
    """The back end has no room to write (the embedded store's disk, etcd's space quota): reads
    still work and nothing half-written is kept; its message names where space is missing. The
    provider answers 507 Insufficient Storage for it."""


class DatastoreDenied(DatastoreUnavailable):
    """The back end refused our login or a permission: unavailable to us until an operator fixes
    the credentials (callers answer 503 as for an outage), and never retried."""


@dataclass(frozen=True)
class KV:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None = None


@dataclass(frozen=True)
class Event:
    type: Literal["put", "delete"]
    key: str
    value: bytes | None
    mod_revision: int


class Lease(ABC):
    id: int
    ttl: int

    @abstractmethod
    def refresh(self) -> None: ...

    @abstractmethod
    def revoke(self) -> None: ...


class Watch:
    """Events of a prefix, in revision order; iterate, or `get(timeout)`; `cancel()` ends it."""

    _END = object()

    def __init__(self, on_cancel: Callable[[], None] | None = None):
        self._q: queue.Queue = queue.Queue()
        self._on_cancel = on_cancel
        self.cancelled = False

    def _deliver(self, event: Event) -> None:
        self._q.put(event)

    def get(self, timeout: float | None = None) -> Event | None:
        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is self._END:
            self._q.put(self._END)
            return None
        return item

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self._on_cancel:
                self._on_cancel()
            self._q.put(self._END)

    def __iter__(self) -> Iterator[Event]:
        while True:
            item = self._q.get()
            if item is self._END:
                self._q.put(self._END)
                return
            yield item


def to_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def lease_id(lease: Lease | int | None) -> int | None:
    if lease is None:
        return None
    return lease if isinstance(lease, int) else lease.id


class Datastore(ABC):
    @abstractmethod
    def get(self, key: str) -> KV | None: ...

    @abstractmethod
    def get_prefix(self, prefix: str) -> list[KV]:
        """Sorted by key."""

    @abstractmethod
    def put(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> int:
        """Returns the new revision."""

    @abstractmethod
    def delete(self, key: str) -> bool: ...

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int: ...

    @abstractmethod
    def create(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> bool:
        """Put only if the key is absent (the building block of leader election)."""

    def compare_and_swap(
        self,
        key: str,
        new_value: bytes | str,
        *,
        expected_value: bytes | None = None,
        expected_mod_revision: int | None = None,
    ) -> bool:
        """Replace an existing key's value if it still has the expected value and/or revision."""
        if expected_value is None and expected_mod_revision is None:
            raise ValueError("compare_and_swap: give expected_value or expected_mod_revision")
        expected = None if expected_value is None else to_bytes(expected_value)
        return self._compare_and_swap(key, to_bytes(new_value), expected, expected_mod_revision)

    @abstractmethod
    def _compare_and_swap(
        self, key: str, new_value: bytes, expected_value: bytes | None, expected_mod_revision: int | None
    ) -> bool: ...

    @abstractmethod
    def lease(self, ttl_s: int) -> Lease: ...

    @abstractmethod
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch: ...

    @abstractmethod
    def close(self) -> None: ...

    def get_json(self, key: str) -> Any | None:
        kv = self.get(key)
        return None if kv is None else json.loads(kv.value)

    def put_json(self, key: str, obj: Any, lease: Lease | int | None = None) -> int:
        return self.put(key, json.dumps(obj, sort_keys=True), lease)
