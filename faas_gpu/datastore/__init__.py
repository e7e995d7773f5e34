"""One datastore interface, two back ends: embedded (SQLite, single node) and etcd (cluster)."""

from __future__ import annotations

from pathlib import Path

from faas_gpu import paths

from .base import KV, Datastore, DatastoreError, DatastoreUnavailable, Event, Lease, Watch

__all__ = [
    "KV",
    "Datastore",
    "DatastoreError",
    "DatastoreUnavailable",
    "Event",
    "Lease",
    "Watch",
    "open_datastore",
]


def open_datastore(
    url: str | None = None, path: Path | None = None, *, timeout_s: float | None = None, retry_s: float | None = None
) -> Datastore:
    """None or "embedded" -> the embedded store at `path`; an http(s)/etcd URL -> etcd.

    `timeout_s` / `retry_s` bound one etcd call and its retries (defaults: `etcd.TIMEOUT_S`,
    `etcd.RETRY_S`); a request path passes short ones so it answers 503 rather than hangs."""
    if url in (None, "", "embedded"):
        from .embedded import EmbeddedDatastore

        return EmbeddedDatastore(path or paths.state_db())
    if url.split("://", 1)[0] in ("http", "https", "etcd") or "://" not in url:
        from .etcd import RETRY_S, TIMEOUT_S, EtcdDatastore

        return EtcdDatastore(
            url.replace("etcd://", "http://"),
            timeout_s=TIMEOUT_S if timeout_s is None else timeout_s,
            retry_s=RETRY_S if retry_s is None else retry_s,
        )
    raise ValueError(f"datastore URL: {url!r} is neither 'embedded' nor an etcd URL")
