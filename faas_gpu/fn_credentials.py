"""Per-function credentials for the GPU path: what a replica holds instead of the cluster token.

Why: a replica runs its user's code and may print its environment (the `printenv` example
does, without auth), so whatever it holds must not let anyone act for other functions. The
cluster-wide token (`secrets/gpu-manager-token`) stays with the daemons; each function gets its
own random token, issued by the provider at deploy and revoked on remove.

- The datastore holds `/faas-gpu/fn-credentials/<sha256 of the token>` -> {namespace, name}:
  a copy of the datastore (an etcd backup, a debug dump) gives no usable token.
- The plaintext lives only in the provider's state folder (`secrets/function-tokens/`, 0700,
  each file 0600), so a replica restarted later, or after a provider restart, gets the same one.
- A function's uploads are recorded under `/faas-gpu/fn-models/<namespace>/<name>/<digest>`.
  Models are content-addressed, so uploading the same bytes proves possession: a function may
  run only digests it uploaded itself, and a stolen digest alone runs nothing.
- The scheduler resolves a bearer token to the cluster (its own token) or a function, with a
  short cache (`CACHE_S`): a removed function's token stops working within seconds. What it
  knows it answers from memory, refreshed in the background: a job never waits on the
  datastore, which may be away for a while (issue 42).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore, DatastoreUnavailable
from faas_gpu.datastore.background import Background
from faas_gpu.models.batch_limits import BatchLimits
from faas_gpu.serving import token_matches

CREDENTIALS_PREFIX = keys.FN_CREDENTIALS
MODELS_PREFIX = keys.FN_MODELS
CACHE_S = 2.0
_CACHE_MAX = 10_000  # random tokens sent by a client must not grow the cache without bound
T = TypeVar("T")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the cluster (a daemon holding the cluster token) or one function."""

    namespace: str | None = None
    name: str | None = None

    @property
    def cluster(self) -> bool:
        return self.name is None

    @property
    def label(self) -> str:
        return "cluster" if self.cluster else f"{self.name}.{self.namespace}"


CLUSTER = Caller()


def _models_key(namespace: str, name: str, digest: str = "") -> str:
    return f"{MODELS_PREFIX}{quote(namespace, safe='')}/{quote(name, safe='')}/{digest}"


def uploaded_batches(ds: Datastore, namespace: str, name: str) -> dict[str, BatchLimits]:
    """What batch each model a function uploaded accepts, by digest (`record_upload`); a record
    without one (an older scheduler's) or unreadable is unknown."""
    out: dict[str, BatchLimits] = {}
    prefix = _models_key(namespace, name)
    for kv in ds.get_prefix(prefix):
        digest = kv.key[len(prefix) :]
        try:
            value = json.loads(kv.value) if kv.value else {}
        except ValueError:
            value = {}
        out[digest] = BatchLimits.from_json(value.get("batch") if isinstance(value, dict) else None)
    return out


class FunctionCredentials:
    """The provider's side: issue a function's token at deploy, revoke it on remove."""

    def __init__(self, datastore: Datastore, folder: Path):
        self.ds = datastore
        self.folder = Path(folder)
        self._lock = threading.Lock()

    def _file(self, namespace: str, name: str) -> Path:
        # quoted: a name never becomes a path ("a/../b" is one file name here)
        return self.folder / quote(f"{namespace}.{name}", safe="")

    def _stored(self, namespace: str, name: str) -> str:
        """The function's token from its file ("" when it has none)."""
        try:
            return self._file(namespace, name).read_text().strip()
        except FileNotFoundError:
            return ""

    def issue(self, namespace: str, name: str) -> str:
        """The function's token (the same one until it is removed); its record is (re)written,
        so a datastore that lost it (a new etcd) learns it again when a replica starts."""
        with self._lock:
            path = self._file(namespace, name)
            token = self._stored(namespace, name)
            if not token:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(self.folder, 0o700)
                token = secrets.token_urlsafe(32)
                tmp = path.with_name(path.name + ".tmp")
                tmp.unlink(missing_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(token)
                tmp.replace(path)
            record = json.dumps({"namespace": namespace, "name": name})
            self.ds.put(CREDENTIALS_PREFIX + token_digest(token), record)
            return token

    def token(self, namespace: str, name: str) -> str:
        """The token for a replica's environment: the file alone (a replica restarted while the
        datastore is away still starts), issued first when there is none."""
        return self._stored(namespace, name) or self.issue(namespace, name)

    def revoke(self, namespace: str, name: str) -> None:
        """The token stops working (within the scheduler's cache time) and its uploads are forgotten."""
        with self._lock:
            token = self._stored(namespace, name)
            if token:
                self.ds.delete(CREDENTIALS_PREFIX + token_digest(token))
            self.ds.delete_prefix(_models_key(namespace, name))
            self._file(namespace, name).unlink(missing_ok=True)


class CredentialResolver:
    """The scheduler's side: a bearer token -> the cluster, a function, or None (401).

    Every job route asks it twice (who is calling, and do they own the model), so a function it
    knows never waits on the datastore (issue 42): a known answer is served from memory, read again
    in the background once it is `REFRESH_AFTER` of `cache_s` old, and waited for (at most
    `WAIT_S`) only once it is older than `cache_s` while the datastore answers. A revoked token or
    model so stops working within `cache_s` and a read; while the datastore does not answer, the
    last answer stands until it is back. An upload is the function's at once (it proved it holds
    the bytes); its record is written in the background and again until the datastore takes it.
    A token or a model never seen is read before it is answered (503 when the datastore is away)."""

    REFRESH_AFTER = 0.5
    WAIT_S = 0.25

    def __init__(
        self,
        datastore: Datastore,
        cluster_token: str,
        cache_s: float = CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ds, self.cluster_token = datastore, cluster_token
        self.cache_s, self.clock = cache_s, clock
        self._tokens: dict[str, tuple[Caller | None, float]] = {}  # token digest -> (who, read at)
        self._owned: dict[tuple[Caller, str], float] = {}  # (function, digest) -> read at
        # uploads whose record the datastore has not taken yet -> the value to write
        self._unwritten: dict[tuple[Caller, str], str] = {}
        self._lock = threading.Lock()
        self._background = Background(name="credentials")

    def _known(self, value: T, read_at: float, key: Hashable, read: Callable[[], T]) -> T:
        """A known answer now: refreshed in the background once aging, waited for briefly once expired."""
        age = self.clock() - read_at
        if age < self.cache_s * self.REFRESH_AFTER:
            return value
        future = self._background.submit(key, read)
        if age < self.cache_s or self._background.down:
            return value
        try:
            return future.result(timeout=self.WAIT_S)
        except (DatastoreUnavailable, TimeoutError):
            return value

    def resolve(self, token: str | None) -> Caller | None:
        if token is None:
            return None
        if token_matches(token, self.cluster_token):
            return CLUSTER
        key = token_digest(token)
        with self._lock:
            hit = self._tokens.get(key)
        if hit is not None and hit[0] is not None:
            return self._known(hit[0], hit[1], ("token", key), lambda: self._read_token(key))
        if hit is not None and self.clock() - hit[1] < self.cache_s:
            return None  # refused a moment ago
        try:
            return self._read_token(key)
        except DatastoreUnavailable:
            if hit is not None:  # refused before the datastore went away: still refused
                return None
            raise

    def _read_token(self, key: str) -> Caller | None:
        kv = self.ds.get(CREDENTIALS_PREFIX + key)
        caller = None
        if kv is not None:
            try:
                body = json.loads(kv.value)
                caller = Caller(str(body["namespace"]), str(body["name"]))
            except (ValueError, KeyError, TypeError):
                caller = None
        with self._lock:
            if len(self._tokens) >= _CACHE_MAX:
                self._tokens.clear()
            self._tokens[key] = (caller, self.clock())
        return caller

    def record_upload(self, caller: Caller, digest: str, batch: BatchLimits | None = None) -> None:
        """A function uploaded these bytes: it may run them from now on (the record is written
        in the background; a datastore that refuses it outright raises here). `batch`, what the
        model accepts (issue 43), is kept as the record's value for `faas-gpu describe` and
        INFless's planner (`uploaded_batches`); sealed like every record, so read back authenticated."""
        if caller.cluster:
            return
        owned = (caller, digest)
        value = json.dumps({"batch": batch.to_json()}) if batch is not None else ""
        with self._lock:
            self._owned[owned] = self.clock()
            self._unwritten[owned] = value
        try:
            self._background.submit(("upload", owned), lambda: self._write_upload(owned)).result(timeout=self.WAIT_S)
        except (DatastoreUnavailable, TimeoutError):
            pass  # written later: with the next job that asks about it
        except Exception:
            with self._lock:
                self._unwritten.pop(owned, None)
                self._owned.pop(owned, None)
            raise

    def _write_upload(self, owned: tuple[Caller, str]) -> None:
        caller, digest = owned
        with self._lock:
            value = self._unwritten.get(owned)
        if value is None:
            return  # written already
        self.ds.put(_models_key(caller.namespace, caller.name, digest), value)
        with self._lock:
            self._unwritten.pop(owned, None)

    def owns(self, caller: Caller, digest: str) -> bool:
        """The cluster may run any model; a function only what it uploaded itself."""
        if caller.cluster:
            return True
        owned = (caller, digest)
        with self._lock:
            read_at = self._owned.get(owned)
            unwritten = owned in self._unwritten
        if unwritten:  # uploaded here; its record waits for the datastore
            self._background.submit(("upload", owned), lambda: self._write_upload(owned))
            return True
        if read_at is not None:
            return self._known(True, read_at, ("owns", owned), lambda: self._read_owned(owned))
        return self._read_owned(owned)

    def _read_owned(self, owned: tuple[Caller, str]) -> bool:
        caller, digest = owned
        there = self.ds.get(_models_key(caller.namespace, caller.name, digest)) is not None
        with self._lock:
            if owned in self._unwritten:
                return True
            if not there:
                self._owned.pop(owned, None)
                return False
            if len(self._owned) >= _CACHE_MAX:
                self._owned.clear()
            self._owned[owned] = self.clock()
        return True
