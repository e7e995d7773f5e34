"""The etcd back end, on etcd-sdk-python (`pyetcd`, a maintained fork of python-etcd3).

Every call retries on connection errors for `retry_s`, so a daemon rides out an etcd restart;
watches re-subscribe from the last revision they delivered, so no event is lost across one.
Once a call has spent its retries the store is known to be down: later calls retry only for
`DOWN_RETRY_S` (no caller waits `retry_s` again) until one succeeds. The gRPC channel reconnects
within `RECONNECT_MAX_MS` of etcd's return, less than `DOWN_RETRY_S`, so a call made as etcd
returns still gets through, and the store resumes by itself.

With a login (etcd's users and roles, `--auth-enable`) the client authenticates on its first call,
not when it is made (a daemon starts while etcd is down), and again whenever etcd says its token is
invalid: etcd's simple tokens live in its memory, so a restart or `--auth-token-ttl` of idleness
ends them. pyetcd's own login does neither, so it is done here. A refused login, a missing one on
an etcd that wants one, or a permission etcd denies is `DatastoreDenied` at once, not retried.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import grpc
import pyetcd
import pyetcd.events
import pyetcd.exceptions as etcd_exc
from pyetcd import etcdrpc

from faas_gpu.credentials import Login

from .base import (
    KV,
    Datastore,
    DatastoreDenied,
    DatastoreFull,
    DatastoreUnavailable,
    Event,
    Lease,
    Watch,
    lease_id,
    to_bytes,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
TIMEOUT_S = 5.0
"""One etcd call's gRPC deadline (a blackholed etcd costs this much per attempt)."""
RETRY_S = 5.0
"""How long a call retries a failing etcd before `DatastoreUnavailable` (only while etcd was up)."""
DOWN_RETRY_S = 0.5
"""How long a call retries while the store is known to be down."""
RECONNECT_MAX_MS = 300
"""gRPC's reconnect backoff cap (its default, 120 s, would keep a returned etcd unused for minutes)."""
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
]
_RETRYABLE = (
    etcd_exc.ConnectionFailedError,
    etcd_exc.ConnectionTimeoutError,
    etcd_exc.NoServerAvailableError,
    etcd_exc.InternalServerError,
    grpc.RpcError,
)


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """`http://h:2379,http://h2:2379` or `etcd://h:2379` -> [(host, port)]."""
    return [(host, port) for host, port, _ in parse_urls(url)]


def parse_urls(url: str) -> list[tuple[str, int, bool]]:
    """`http://h:2379,https://h2:2379` -> [(host, port, TLS or not)]."""
    out = []
    for part in url.split(","):
        part = part.strip()
        if "://" not in part:
            part = "http://" + part
        u = urlsplit(part)
        if not u.hostname:
            raise ValueError(f"etcd URL: {url!r} has no host")
        out.append((u.hostname, u.port or 2379, u.scheme == "https"))
    return out


TLS_FILES = ("etcd-ca.crt", "etcd-client.crt", "etcd-client.key")
"""An https:// etcd's files in the state folder's secrets/: the CA its certificate is checked
against, and this client's certificate and key for etcd's `--client-cert-auth`."""


@dataclass(frozen=True)
class Tls:
    """What an https:// etcd is dialled with: the CA that signed etcd's certificate (None: the
    system's roots), and a client certificate and key (None: none; etcd's `--client-cert-auth`
    wants them)."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_folder(cls, folder: Path | None) -> Tls:
        """The files of `TLS_FILES` that `folder` (a state folder's secrets/) holds."""
        found = [(folder / name).read_bytes() if folder and (folder / name).is_file() else None for name in TLS_FILES]
        if (found[1] is None) != (found[2] is None):
            raise ValueError(f"etcd TLS: {folder} holds only one of etcd-client.crt and etcd-client.key")
        return cls(*found)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def endpoints(url: str, tls: Tls | None, **kwargs) -> list[pyetcd.Endpoint]:
    """pyetcd's endpoints of `url`: https:// ones over TLS (`tls`, else the system's roots)."""
    return [
        pyetcd.Endpoint(h, p, secure=secure, creds=(tls or Tls()).credentials() if secure else None, **kwargs)
        for h, p, secure in parse_urls(url)
    ]


def _reason(exc: Exception) -> str:
    """A one-line cause (a gRPC error's own text runs to many lines of debug detail)."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name}: {exc.details()}"
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")


class EtcdLease(Lease):
    def __init__(self, store: EtcdDatastore, lease: pyetcd.Lease):
        self.store, self._lease, self.id, self.ttl = store, lease, lease.id, lease.ttl

    def refresh(self) -> None:
        responses = self.store._retry(lambda: list(self.store.client.refresh_lease(self.id)))
        if not responses or responses[0].TTL <= 0:
            raise ValueError(f"lease: {self.id} has expired or does not exist")

    def revoke(self) -> None:
        self.store._retry(lambda: self.store.client.revoke_lease(self.id))


_AUTH_WORDS = re.compile(r"user name is empty|auth|password|permission", re.IGNORECASE)
"""What etcd's INVALID_ARGUMENT says when it is about the login (another one is a bad request)."""


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _code(exc: BaseException) -> grpc.StatusCode | None:
    return exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None


class EtcdDatastore(Datastore):
    def __init__(
        self,
        url: str,
        timeout_s: float = TIMEOUT_S,
        retry_s: float = RETRY_S,
        login: Login | None = None,
        tls: Tls | None = None,
    ):
        self.url = url
        dialled = endpoints(url, tls, time_retry=0.2, opts=_CHANNEL_OPTIONS)
        self.client = pyetcd.MultiEndpointEtcd3Client(endpoints=dialled, timeout=timeout_s, failover=True)
        if login is not None and any(not e.secure and not _loopback(e.host) for e in dialled):
            log.warning(
                "etcd at %s: the login from %s crosses the network in clear over http://; use https:// "
                "(README: 'etcd and Redis with authentication')",
                url,
                login.where,
            )
        self.retry_s = retry_s
        self._closed = False
        self._down = False  # the last call spent its retries and none has succeeded since
        self._login = login
        self._auth_lock = threading.Lock()
        self._token_generation = 0  # bumped by each login: a thread re-logs in only for the token it used
        self._warned_auth_off = False

    # -- authentication --------------------------------------------------------------------------
    def _authenticate(self, generation: int) -> None:
        """Log in (again) unless another thread did since `generation`; the new token goes on every
        later call and stream."""
        login = self._login
        if login is None:
            return
        with self._auth_lock:
            if self._token_generation != generation:
                return
            request = etcdrpc.AuthenticateRequest(name=login.user or "", password=login.password)
            try:
                resp = self.client.authstub.Authenticate(request, self.client.timeout)
            except grpc.RpcError as exc:
                code = _code(exc)
                if code is grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in (exc.details() or ""):
                    if not self._warned_auth_off:
                        log.warning(
                            "etcd at %s has authentication off: the login from %s is not needed, and anyone who "
                            "reaches etcd can write to it (enable it: README, 'etcd and Redis with authentication')",
                            self.url,
                            login.where,
                        )
                        self._warned_auth_off = True
                    self.client.metadata = None
                elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
                    raise DatastoreDenied(
                        f"datastore (etcd at {self.url}) refused the login of user {login.user!r} "
                        f"(from {login.where}): {exc.details()}"
                    ) from None
                else:
                    raise
            else:
                self.client.metadata = (("token", resp.token),)
            self._token_generation += 1
            watcher = self.client._stubs.get("watcher")
            if watcher is not None:  # its next stream (a watch re-subscribing) carries the new token
                watcher._metadata = self.client.metadata

    def _denied(self, exc: grpc.RpcError) -> DatastoreDenied:
        details = exc.details() or ""
        if "user name is empty" in details or (self._login is None and _code(exc) is grpc.StatusCode.UNAUTHENTICATED):
            return DatastoreDenied(
                f"datastore (etcd at {self.url}) wants a login: give the daemons --etcd-credentials FILE "
                f"(user:password), or secrets/etcd-credentials in the state folder ({details})"
            )
        who = f"user {self._login.user!r} (from {self._login.where})" if self._login else "an anonymous client"
        return DatastoreDenied(f"datastore (etcd at {self.url}) denied {who}: {details}")

    def _retry(self, op: Callable[[], T]) -> T:
        deadline = time.monotonic() + (min(DOWN_RETRY_S, self.retry_s) if self._down else self.retry_s)
        delay = 0.05
        relogged = False
        while True:
            generation = self._token_generation
            try:
                if self._login is not None and generation == 0:
                    self._authenticate(generation)
                result = op()
            except (DatastoreDenied, DatastoreFull):
                raise
            except grpc.RpcError as exc:
                code = _code(exc)
                stale = code is grpc.StatusCode.UNAUTHENTICATED or (
                    code is grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in (exc.details() or "")
                )
                if stale and self._login is not None and not relogged:
                    # the token ran out or etcd restarted, or auth was turned on after this client
                    # found it off: log in once more, then retry
                    relogged = True
                    try:
                        self._authenticate(generation)
                    except _RETRYABLE:
                        pass
                    continue
                if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "space exceeded" in (exc.details() or ""):
                    raise DatastoreFull(
                        f"datastore (etcd at {self.url}) is out of space ({exc.details()}): nothing was changed; "
                        "its operator compacts and defragments it, then disarms the NOSPACE alarm"
                    ) from None
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
                    code is grpc.StatusCode.INVALID_ARGUMENT and _AUTH_WORDS.search(exc.details() or "")
                ):
                    raise self._denied(exc) from None
                if self._closed or time.monotonic() + delay > deadline:
                    self._down = True
                    reason = _reason(exc)
                    raise DatastoreUnavailable(f"datastore (etcd at {self.url}) is unavailable: {reason}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except _RETRYABLE as exc:
                if self._closed or time.monotonic() + delay > deadline:
                    self._down = True
                    reason = _reason(exc)
                    raise DatastoreUnavailable(f"datastore (etcd at {self.url}) is unavailable: {reason}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            else:
                if self._down:
                    log.info("datastore (etcd at %s) is reachable again", self.url)
                self._down = False
                return result

    @staticmethod
    def _kv(value: bytes, meta) -> KV:
        return KV(
            meta.key.decode(),
            bytes(value),
            meta.create_revision,
            meta.mod_revision,
            meta.version,
            meta.lease_id or None,
        )

    def get(self, key: str) -> KV | None:
        value, meta = self._retry(lambda: self.client.get(key))
        return None if meta is None else self._kv(value, meta)

    def get_prefix(self, prefix: str) -> list[KV]:
        items = self._retry(lambda: list(self.client.get_prefix(prefix, sort_order="ascend", sort_target="key")))
        return [self._kv(v, m) for v, m in items]

    def put(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> int:
        resp = self._retry(lambda: self.client.put(key, to_bytes(value), lease=lease_id(lease)))
        return resp.header.revision

    def delete(self, key: str) -> bool:
        return bool(self._retry(lambda: self.client.delete(key)))

    def delete_prefix(self, prefix: str) -> int:
        return self._retry(lambda: self.client.delete_prefix(prefix)).deleted

    def create(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> bool:
        tx = self.client.transactions
        ok, _ = self._retry(
            lambda: self.client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, to_bytes(value), lease=lease_id(lease))],
                failure=[],
            )
        )
        return ok

    def _compare_and_swap(
        self, key: str, new_value: bytes, expected_value: bytes | None, expected_mod_revision: int | None
    ) -> bool:
        tx = self.client.transactions
        compare = [tx.version(key) > 0]
        if expected_value is not None:
            compare.append(tx.value(key) == expected_value)
        if expected_mod_revision is not None:
            compare.append(tx.mod(key) == expected_mod_revision)
        current = self.get(key)
        lease = current.lease if current else None
        ok, _ = self._retry(
            lambda: self.client.transaction(compare=compare, success=[tx.put(key, new_value, lease=lease)], failure=[])
        )
        return ok

    def lease(self, ttl_s: int) -> Lease:
        return EtcdLease(self, self._retry(lambda: self.client.lease(ttl_s)))

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Events under `prefix` from `start_revision`, or else from the store's revision when the
        call is made: the watch's stream is opened by a thread a moment later, and a watch that
        asked etcd for "now" then would lose what changed in between (and across an etcd restart
        before its first event, everything until it re-subscribed). When etcd cannot be reached
        the watch starts from the revision it finds once it can, as it did before."""
        if start_revision is None:
            start_revision = self._current_revision(prefix)
        stop = threading.Event()
        watch = Watch(stop.set)
        threading.Thread(target=self._pump_watch, args=(prefix, start_revision, watch, stop), daemon=True).start()
        return watch

    def _current_revision(self, prefix: str) -> int | None:
        """The store's revision + 1 (one read of `prefix`, retried as every call is: a new client's
        first call may fail while its channel connects), or None when etcd cannot be read: a watch
        is made while etcd is down too, and must not raise."""
        if self._down:  # known down: no wait for retries
            return None
        try:
            return self._retry(lambda: self.client.get_response(prefix)).header.revision + 1
        except DatastoreUnavailable as exc:
            log.debug("etcd watch on %s: no revision to start from (%s); it starts when it connects", prefix, exc)
            return None

    def _check_login(self, key: str) -> None:
        """Before a watch (re)subscribes: a token etcd no longer knows (it restarted) is replaced
        first. etcd answers a watch made with such a token as created and cancelled at once, which
        pyetcd takes for a live watch that never delivers anything."""
        if self._login is None:
            return
        generation = self._token_generation
        try:
            if generation == 0:
                self._authenticate(generation)
            else:
                self.client.get_response(key, keys_only=True, limit=1)
        except grpc.RpcError as exc:
            if _code(exc) is not grpc.StatusCode.UNAUTHENTICATED and "user name is empty" not in (exc.details() or ""):
                raise
            self._authenticate(generation)

    def _pump_watch(self, prefix: str, start_revision: int | None, watch: Watch, stop: threading.Event) -> None:
        next_rev = start_revision
        while not stop.is_set() and not self._closed:
            try:
                self._check_login(prefix)
                kwargs = {"start_revision": next_rev} if next_rev else {}
                events, cancel = self.client.watch_prefix(prefix, **kwargs)
                canceller = threading.Thread(target=lambda c=cancel: (stop.wait(), c()), daemon=True)
                canceller.start()
                for ev in events:
                    if stop.is_set():
                        break
                    kind = "delete" if isinstance(ev, pyetcd.events.DeleteEvent) else "put"
                    rev = ev.mod_revision
                    watch._deliver(Event(kind, ev.key.decode(), None if kind == "delete" else bytes(ev.value), rev))
                    next_rev = rev + 1
            except Exception as exc:  # the stream broke (etcd restarted): re-subscribe
                if stop.is_set() or self._closed:
                    return
                log.debug("etcd watch on %s broke (%s); re-subscribing", prefix, exc)
                time.sleep(0.2)

    def close(self) -> None:
        self._closed = True
        self.client.close()
