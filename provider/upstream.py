"""The gateway's HTTP to a function's replicas: one kept-alive connection per (serving thread,
replica address).

urllib3's PoolManager cost ~0.41 ms of CPU per forwarded call (its URL parsing, pool bookkeeping,
header dict and retry objects); a kept-alive `http.client` connection per thread measured
0.17-0.22 ms (issue 20, EXPERIMENTS), of which the e-mail package's parse of the answer's headers
was the largest part; `faas_gpu.http1` reads the answer without it. Each gateway thread serves
one call at a time, so a thread-local connection per address needs no lock and no pool.

What urllib3's pool did for us and this keeps:
- a kept-alive connection the replica closed while idle is found before it is used (the socket
  reads as ready: EOF or unexpected bytes) and reopened;
- failures map to the outcomes the gateway answers: `ReplicaRefused` (no connection made: the call
  never reached the replica), `ReplicaTimeout` (504), `ReplicaDropped` (the connection was lost
  after the call was sent and before its answer was whole: the gateway's one resend);
- an unusual request target (dot segments, `%`, `#`, `?`, characters outside RFC 3986's path
  set) is normalized by urllib3's own `parse_url`, as before; a plain one skips it.

A kept-alive connection can also be closed by the replica in the instant between that check and
the request (a server's idle timeout racing the call). That failure, on a reused connection and
before any byte of an answer, is sent once more on a fresh connection when the caller allows it
(`may_resend`: the gateway allows it where it would resend a dropped call anyway); a fresh
connection's failure is never resent here.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable

from urllib3.util import parse_url

from faas_gpu.http1 import BodyStream, Connection, ProtocolError, RemoteClosed, ThreadConnections

MAX_PER_THREAD = 64
"""Replica addresses a thread keeps a connection to; the least recently used beyond are closed,
so connections to replicas long gone do not pile up."""

_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")
_PLAIN_QUERY = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?]*")
_STALE = (RemoteClosed, BrokenPipeError, ConnectionResetError)
"""What a kept-alive connection the replica closed meanwhile fails with, before any answer byte."""


class ReplicaError(Exception):
    """The replica gave no usable answer (OpenFaaS's 502 `Can't reach service`)."""


class ReplicaRefused(ReplicaError):
    """No connection could be made (refused, unreachable, unknown host): the call never reached
    the replica, so sending it elsewhere is safe even for a POST."""


class ReplicaTimeout(ReplicaError):
    """No connection, or no answer, within the call's timeout (504)."""


class ReplicaDropped(ReplicaError):
    """The connection was lost after the call was sent, before its answer was whole: the replica
    may have run it (the gateway resends once, under `com.faas-gpu.retry-on-reset`)."""


def request_target(path: str, query: str) -> str:
    """The request line's target, as urllib3 made it from `http://host{path}?{query}`."""
    path = path or "/"
    if _PLAIN_PATH.fullmatch(path) and "/." not in path and (not query or _PLAIN_QUERY.fullmatch(query)):
        return f"{path}?{query}" if query else path
    return parse_url("http://h" + path + (f"?{query}" if query else "")).request_uri


class ReplicaConnections:
    """Per-thread kept-alive connections to replicas, keyed by base URL (`http://host:port`)."""

    def __init__(self, max_per_thread: int = MAX_PER_THREAD):
        self._kept = ThreadConnections(max_per_thread)

    def _connections(self) -> OrderedDict[str, Connection]:
        return self._kept.connections()

    def request(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout_s: float,
        may_resend: Callable[[], bool] | None = None,
        stream: bool = False,
    ) -> tuple[int, list[tuple[str, str]], bytes | ReplicaStream]:
        """(status, headers as sent with repeats, whole body); raises a `ReplicaError`. With
        `stream`, an answer without a length (the replica streams it) comes back once its head
        is read, its body a `ReplicaStream` to read within the same `timeout_s` from now."""
        conn, reused = self._kept.get(base_url, timeout_s)
        deadline = time.monotonic() + timeout_s if stream else 0.0
        try:
            if reused:
                if conn.timeout != timeout_s:
                    conn.settimeout(timeout_s)
                try:
                    return self._exchange(conn, method, target, headers, body, base_url, stream, deadline)
                except _STALE as exc:
                    if may_resend is not None and not may_resend():
                        raise ReplicaDropped(f"{base_url}: {exc!r}") from exc
                    conn.close()  # the replica closed it while it idled: once more, on a fresh one
                    try:
                        self._connect(conn, timeout_s)
                    except ReplicaRefused as refused:  # the first send may have reached it
                        raise ReplicaDropped(str(refused)) from exc
            else:
                self._connect(conn, timeout_s)
            return self._exchange(conn, method, target, headers, body, base_url, stream, deadline)
        except BaseException as exc:
            self._kept.forget(base_url, conn)
            if isinstance(exc, ReplicaError):
                raise
            if isinstance(exc, TimeoutError):
                raise ReplicaTimeout(f"{base_url}: {exc!r}") from exc
            if isinstance(exc, (OSError, ProtocolError)):  # urllib3's ProtocolError
                raise ReplicaDropped(f"{base_url}: {exc!r}") from exc
            raise

    @staticmethod
    def _connect(conn: Connection, timeout_s: float) -> None:
        conn.timeout = timeout_s
        try:
            conn.connect()
        except TimeoutError as exc:
            raise ReplicaTimeout(f"{conn.host}:{conn.port}: connect: {exc!r}") from exc
        except OSError as exc:  # refused, unreachable, unknown host: urllib3's NewConnectionError
            raise ReplicaRefused(f"{conn.host}:{conn.port}: {exc!r}") from exc

    def _exchange(
        self,
        conn: Connection,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        base_url: str,
        stream: bool = False,
        deadline: float = 0.0,
    ) -> tuple[int, list[tuple[str, str]], bytes | ReplicaStream]:
        """Send and read the whole answer (or its head, for a stream). A stale-connection error
        from the send or the status line is raised as it is (the caller decides on the resend);
        later ones are mapped."""
        conn.send(method, target, headers, body)
        try:
            answer = conn.read_answer(method, stream)
        except RemoteClosed:  # before any byte of an answer
            raise
        except TimeoutError as exc:
            raise ReplicaTimeout(f"{base_url}: {exc!r}") from exc
        except (OSError, ProtocolError) as exc:  # a bad answer, cut short, reset mid-body
            raise ReplicaDropped(f"{base_url}: {exc!r}") from exc
        if answer.stream is not None:
            return answer.status, answer.headers, ReplicaStream(self._kept, base_url, conn, answer, deadline)
        if answer.will_close:  # `Connection: close`, or a body delimited by the connection's end
            self._kept.forget(base_url, conn)
        return answer.status, answer.headers, answer.body


class ReplicaStream:
    """A replica's streamed answer body, read piece by piece as it arrives (iterate it), the
    whole of it within the call's timeout. The connection is kept for the thread's next call only
    when the body was read to its end and the replica keeps it open; `close` (always called: the
    WSGI server calls it when the answer ends, whole or not) closes it otherwise, which is how the
    replica learns that its caller went away. Failures: `ReplicaTimeout` (the timeout passed) and
    `ReplicaDropped` (cut short, or not HTTP): the answer has begun, so it is never resent."""

    __slots__ = ("_kept", "_base_url", "_conn", "_body", "_will_close", "_deadline", "_done")

    def __init__(self, kept: ThreadConnections, base_url: str, conn: Connection, answer, deadline: float):
        self._kept, self._base_url, self._conn = kept, base_url, conn
        self._body: BodyStream = answer.stream
        self._will_close = answer.will_close
        self._deadline = deadline
        self._done = False

    @property
    def complete(self) -> bool:
        return self._body.complete

    @property
    def deadline(self) -> float:
        """`time.monotonic()` by which the whole body must have come (the call's timeout)."""
        return self._deadline

    def __iter__(self) -> ReplicaStream:
        return self

    def __next__(self) -> bytes:
        if self._done:
            raise StopIteration
        left = self._deadline - time.monotonic()
        if left <= 0:
            self.close()
            raise ReplicaTimeout(f"{self._base_url}: the streamed answer ran past the call's timeout")
        conn = self._conn
        if conn.timeout is None or left < conn.timeout:
            conn.settimeout(left)
        try:
            piece = self._body.read()
        except TimeoutError as exc:
            self.close()
            raise ReplicaTimeout(f"{self._base_url}: {exc!r}") from exc
        except (OSError, ProtocolError) as exc:
            self.close()
            raise ReplicaDropped(f"{self._base_url}: {exc!r}") from exc
        if not piece:
            self.close()
            raise StopIteration
        return piece

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        if not self._body.complete or self._will_close:
            self._kept.forget(self._base_url, self._conn)
