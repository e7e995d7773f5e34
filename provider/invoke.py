"""Invoking a function: resolve `fn[.ns]` to a ready replica and forward the request.

This is faasd's InvokeResolver seam: the dispatcher that picks an instance lives behind
`Invoker.pick`, so the INFless rate split can replace round robin without touching routes.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from faas_gpu.datastore import DatastoreUnavailable
from faas_gpu.datastore.background import Background

from .inflight import InflightLimiter, max_inflight_of
from .runtime import Runtime
from .store import FunctionStore
from .streaming import StreamedAnswer
from .types import split_namespace
from .upstream import (
    ReplicaConnections,
    ReplicaDropped,
    ReplicaError,
    ReplicaRefused,
    ReplicaStream,
    ReplicaTimeout,
    request_target,
)

__all__ = [
    "ColdStartTimeout",
    "Endpoint",
    "Invoker",
    "NotFound",
    "ReplicaDropped",
    "ReplicaError",
    "ReplicaRefused",
    "ReplicaTimeout",
    "Result",
]

log = logging.getLogger(__name__)
KNOWN_TTL_S = 1.0
"""How long a function found in the datastore is taken as existing without reading it again."""

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailers",
        "Transfer-Encoding",
        "Upgrade",
        "Content-Length",
        "Host",
    )
)


@dataclass
class Result:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    stream: StreamedAnswer | None = None
    """A streamed answer (the replica sent no length): `body` is empty and this sends the body
    on as it arrives (`provider.streaming`)."""


class NotFound(Exception):
    pass


class Unavailable(Exception):
    """The function cannot serve for a reason of its own (crash-looping, failing to start): 503."""


class ColdStartTimeout(Exception):
    """No replica of a function at zero (or still starting) became ready within the gateway's wait."""

    def __init__(self, waited_s: float):
        super().__init__(f"cold start: no replica became ready within {waited_s:.1f}s")
        self.waited_s = waited_s


@dataclass
class Endpoint:
    """Where a call goes, and how long it waited for a replica to start (0: one was ready)."""

    url: str
    cold_s: float = 0.0


class Invoker:
    def __init__(
        self,
        store: FunctionStore,
        runtime: Runtime,
        namespaces: tuple[str, ...],
        *,
        upstream_timeout_s: float,
        ready_timeout_s: float,
        threads: int = 64,
        max_inflight_per_function: int | None = None,
    ):
        """`threads`: the gateway's request threads, which the in-flight limits share out."""
        self.store = store
        self.runtime = runtime
        self.default_namespace = namespaces[0]
        self.upstream_timeout_s = upstream_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.replicas = ReplicaConnections()
        self._rr: dict[tuple[str, str], itertools.count] = {}
        self._known: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}
        self.dispatcher = None  # the autoscaler: weighs a managed function's instances
        self.inflight = InflightLimiter(threads, max_inflight_per_function)
        self._background = Background(name="function-records")

    def resolve(self, raw_name: str) -> tuple[str, str]:
        name, ns = split_namespace(raw_name, None)
        return ns or self.default_namespace, name

    def exists(self, key: tuple[str, str]) -> bool:
        """Cached for a second: the hot path must not read the datastore on every call.

        A function this provider knows is read again past that second off the call's thread
        (issue 42: no call waits on the datastore), and it still exists while the datastore is
        unavailable (its replicas keep serving); one deleted elsewhere is 404 once that read is
        back. An unknown one is read now, and raises DatastoreUnavailable when it cannot be: the
        caller cannot tell it apart from a missing function."""
        seen = self._known.get(key)
        now = time.monotonic()
        if seen is not None and now - seen < KNOWN_TTL_S:
            return True
        if self.store.cached(*key) is not None:  # read or written here before: known
            self._background.submit(key, lambda: self._read(key))
            return True
        return self._read(key)

    def _read(self, key: tuple[str, str]) -> bool:
        now = time.monotonic()
        try:
            record = self.store.get(*key)
        except DatastoreUnavailable as exc:
            if self.store.cached(*key) is None:
                raise
            log.warning("%s.%s: serving from the cached record (%s)", key[1], key[0], exc)
            self._known[key] = now
            return True
        if record is None:
            self._known.pop(key, None)
            return False
        self._known[key] = now
        return True

    def inflight_limit(self, key: tuple[str, str]) -> int:
        """The function's share of the gateway's threads (`provider.inflight`)."""
        return self.inflight.per_function

    def replicas_limit(self, key: tuple[str, str]) -> int | None:
        """What the function's ready replicas take at once, from its record as last known
        (validated at deploy): max_inflight x ready replicas; None: unlimited."""
        record = self.store.cached(*key)
        try:
            per_replica = max_inflight_of(record.deployment.envVars) if record is not None else 0
        except ValueError:  # a record from before the check: unlimited, as the watchdog takes it
            per_replica = 0
        return self.inflight.limit(per_replica, len(self.runtime.endpoints(*key))) if per_replica else None

    def forget(self, key: tuple[str, str]) -> None:
        """A deleted function answers 404 at once, not after the existence cache expires."""
        self._known.pop(key, None)
        self._rr.pop(key, None)

    def pick(self, key: tuple[str, str], headers: dict[str, str] | None = None) -> str | None:
        d = self.dispatcher
        if d is not None and d.manages(key):
            return d.pick(key, self.runtime.ready_instances(*key), headers)
        endpoints = self.runtime.endpoints(*key)
        if not endpoints:
            return None
        counter = self._rr.get(key)
        if counter is None:
            counter = self._rr.setdefault(key, itertools.count())
        return endpoints[next(counter) % len(endpoints)]

    def endpoint(self, key: tuple[str, str], scale_up, headers: dict[str, str] | None = None) -> Endpoint:
        """A ready replica; a function scaled to zero or still starting is waited for, up to the
        ready timeout: a call at zero is demand (`scale_up` starts what serves it, and the call is
        counted in flight meanwhile, so no scaling decision takes that replica away).

        Raises ColdStartTimeout when none became ready in time, Unavailable when the function
        cannot start. The dispatcher may add to `headers` (the request's application) and raises
        BadApp for a request class it cannot place (the caller answers 400). Once it returns, the
        caller calls `done(key)` when the request is over."""
        if not self.exists(key):
            raise NotFound(key)
        if self.dispatcher is not None:
            self.dispatcher.arrived(key, headers)
        try:
            url = self.pick(key, headers)
            if url is not None:
                return Endpoint(url)
            t0 = time.monotonic()
            scale_up(key)
            deadline = t0 + self.ready_timeout_s
            while url is None:
                left = deadline - time.monotonic()
                if left <= 0 or not self.runtime.wait_ready(*key, left):
                    if (problem := self.runtime.problem(*key)) is not None:
                        raise Unavailable(problem["message"])
                    raise ColdStartTimeout(time.monotonic() - t0)
                url = self.pick(key, headers)  # None: the ready one was not the dispatcher's (yet)
                if url is None:
                    time.sleep(0.01)
            return Endpoint(url, time.monotonic() - t0)
        except BaseException:
            self.done(key)
            raise

    def done(self, key: tuple[str, str], status: int | None = None) -> None:
        """The request `endpoint` counted has been answered with `status` or has failed (None):
        the dispatcher's in-flight count and its count of 200s."""
        if self.dispatcher is not None:
            self.dispatcher.departed(key, status)

    def count(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def forward(
        self,
        base_url: str,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        timeout_s: float | None = None,
        may_resend: Callable[[], bool] | None = None,
        stream: bool = False,
    ) -> Result:
        """One call to the replica at `base_url`; raises a `ReplicaError` (see `provider.upstream`).

        `may_resend`, asked only when a kept-alive connection turns out closed by the replica
        under the call, says whether the call may go once more on a fresh connection (None: it
        may). `stream`: an answer the replica streams comes back at its head (`Result.stream`)."""
        out_headers = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
        status, resp_headers, data = self.replicas.request(
            base_url,
            method,
            request_target(path, query),
            out_headers,
            body if body or method not in ("GET", "HEAD") else None,
            timeout_s or self.upstream_timeout_s,
            may_resend,
            stream,
        )
        out = [(k, v) for k, v in resp_headers if k.lower() not in HOP_BY_HOP]
        if isinstance(data, ReplicaStream):
            return Result(status, out, b"", StreamedAnswer(data, base_url))
        return Result(status, out, data)
