"""One datastore interface, two back ends: embedded (SQLite, single node) and etcd (cluster).

The daemons open it with the cluster token (`cluster_token`): every value they write is sealed
and every value they read is checked (`sealed.SealedDatastore`), on both back ends. Without a
token the store holds raw bytes: for tests and tools that look at what is stored."""

from __future__ import annotations

from pathlib import Path

from faas_gpu import paths
from faas_gpu.credentials import ETCD_CREDENTIALS_FILE, resolve_login, split_login

from .base import (
    KV,
    Datastore,
    DatastoreDenied,
    DatastoreError,
    DatastoreFull,
    DatastoreUnavailable,
    Event,
    Lease,
    Watch,
)
from .sealed import Quarantined, SealedDatastore

__all__ = [
    "KV",
    "Datastore",
    "DatastoreDenied",
    "DatastoreError",
    "DatastoreFull",
    "DatastoreUnavailable",
    "Event",
    "Lease",
    "Quarantined",
    "SealedDatastore",
    "Watch",
    "open_datastore",
]


def open_datastore(
    url: str | None = None,
    path: Path | None = None,
    *,
    cluster_token: str | None = None,
    credentials_file: Path | None = None,
    secrets_dir: Path | None = None,
    timeout_s: float | None = None,
    retry_s: float | None = None,
) -> Datastore:
    """None or "embedded" -> the embedded store at `path`; an http(s)/etcd URL -> etcd.

    `cluster_token`: the store seals and checks every record with it (what the daemons open);
    None: raw values. etcd's login: `credentials_file`, else the URL's userinfo, else
    `secrets_dir/etcd-credentials` when it exists (`faas_gpu.credentials.resolve_login`); an
    https:// etcd's CA and client certificate: `secrets_dir`'s `etcd.TLS_FILES` when there.
    `timeout_s` / `retry_s` bound one etcd call and its retries (defaults: `etcd.TIMEOUT_S`,
    `etcd.RETRY_S`); a request path passes short ones so it answers 503 rather than hangs."""
    store: Datastore
    if url in (None, "", "embedded"):
        from .embedded import EmbeddedDatastore

        store = EmbeddedDatastore(path or paths.state_db())
    elif url.split("://", 1)[0] in ("http", "https", "etcd") or "://" not in url:
        from .etcd import RETRY_S, TIMEOUT_S, EtcdDatastore, Tls

        plain, login = resolve_login(url, credentials_file, secrets_dir, ETCD_CREDENTIALS_FILE)
        store = EtcdDatastore(
            plain.replace("etcd://", "http://"),
            timeout_s=TIMEOUT_S if timeout_s is None else timeout_s,
            retry_s=RETRY_S if retry_s is None else retry_s,
            login=login,
            tls=Tls.from_folder(secrets_dir) if "https://" in plain else None,
        )
    else:
        shown = split_login(url)[0]  # never the password a URL carried
        raise ValueError(f"datastore URL: {shown!r} is neither 'embedded' nor an etcd URL")
    return store if cluster_token is None else SealedDatastore(store, cluster_token)
