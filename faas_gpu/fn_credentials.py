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
  short cache (`CACHE_S`): a removed function's token stops working within seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from faas_gpu.contract import keys
from faas_gpu.datastore import Datastore, DatastoreUnavailable
from faas_gpu.models.batch_limits import BatchLimits
from faas_gpu.serving import token_matches

CREDENTIALS_PREFIX = keys.FN_CREDENTIALS
MODELS_PREFIX = keys.FN_MODELS
CACHE_S = 2.0
_CACHE_MAX = 10_000  # random tokens sent by a client must not grow the cache without bound


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
    """The scheduler's side: a bearer token -> the cluster, a function, or None (401)."""

    def __init__(
        self,
        datastore: Datastore,
        cluster_token: str,
        cache_s: float = CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ds, self.cluster_token = datastore, cluster_token
        self.cache_s, self.clock = cache_s, clock
        self._tokens: dict[str, tuple[Caller | None, float]] = {}
        self._owned: dict[tuple[Caller, str], float] = {}
        self._lock = threading.Lock()

    def resolve(self, token: str | None) -> Caller | None:
        if token is None:
            return None
        if token_matches(token, self.cluster_token):
            return CLUSTER
        key = token_digest(token)
        now = self.clock()
        with self._lock:
            hit = self._tokens.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            kv = self.ds.get(CREDENTIALS_PREFIX + key)
        except DatastoreUnavailable:
            # a token this scheduler has resolved before keeps its last answer while the datastore is
            # away (a revocation then takes effect when it is back); an unknown one is the caller's 503
            if hit is not None:
                return hit[0]
            raise
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
            self._tokens[key] = (caller, now + self.cache_s)
        return caller

    def record_upload(self, caller: Caller, digest: str, batch: BatchLimits | None = None) -> None:
        """A function uploaded these bytes: it may run them from now on. `batch`, what the model
        accepts (issue 43), is kept as the record's value for `faas-gpu describe` and INFless's
        planner (`uploaded_batches`); sealed like every record, so read back authenticated."""
        if caller.cluster:
            return
        value = json.dumps({"batch": batch.to_json()}) if batch is not None else ""
        self.ds.put(_models_key(caller.namespace, caller.name, digest), value)
        with self._lock:
            self._owned[(caller, digest)] = self.clock() + self.cache_s

    def owns(self, caller: Caller, digest: str) -> bool:
        """The cluster may run any model; a function only what it uploaded itself."""
        if caller.cluster:
            return True
        now = self.clock()
        with self._lock:
            until = self._owned.get((caller, digest))
        if until is not None and until > now:
            return True
        try:
            if self.ds.get(_models_key(caller.namespace, caller.name, digest)) is None:
                return False
        except DatastoreUnavailable:
            if until is not None:  # known before the datastore went away: still its model
                return True
            raise
        with self._lock:
            if len(self._owned) >= _CACHE_MAX:
                self._owned.clear()
            self._owned[(caller, digest)] = now + self.cache_s
        return True
