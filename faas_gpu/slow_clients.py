"""Slow clients cannot hold a daemon's request threads (slowloris and its kin).

gunicorn's gthread worker hands each new connection to a request thread once its first byte
arrives, and that thread then reads the request head with a blocking socket that has no
timeout: 70 connections that each send one header line every 10 s held every thread of the
gateway, and `/healthz` and every `/function/*` timed out for as long as they kept sending
(issue 41). A thread per slow client is the flaw, so the fix is where connections are read:

- **The head is read by the main thread's poller**, not by a request thread: each readable
  connection's bytes are gathered without blocking until the whole head (and a small body of
  known length, `PREREAD_BODY_MAX`) is there; only then is the connection given a thread, its
  bytes handed to gunicorn's parser as read-ahead. A trickling client costs a wake-up per
  packet, never a thread. The same holds for the next request of a kept-alive connection.
- **A head must arrive within `HEADER_TIMEOUT_S`** (Go's `ReadHeaderTimeout`, nginx's
  `client_header_timeout`): past it the connection is answered 408 and closed; a head over
  `MAX_HEAD_BYTES` is answered 431.
- **Per-client and total bounds evict the oldest waiting head**, not the newcomer: one client
  (one address: on loopback every caller shares 127.0.0.1) keeps at most
  `MAX_HEADS_PER_CLIENT` connections waiting for their head, and a worker at its connection
  limit closes the longest-waiting head (else the longest-idle kept-alive connection) rather
  than stop accepting. A real request's head comes in one packet and is never the oldest.
- **A request thread's reads and writes time out after `IO_TIMEOUT_S`** without progress (a
  large body that stalls, a caller that stops reading its answer): the socket a thread blocks
  on carries that timeout instead of none.
"""

from __future__ import annotations

import errno
import re
import selectors
import socket
import time
from collections import OrderedDict
from functools import partial

HEADER_TIMEOUT_S = 10.0
"""A request's head (request line and headers) must be whole within this of its first byte."""
IO_TIMEOUT_S = 60.0
"""A request thread's blocked read or write of the caller's socket gives up after this."""
MAX_HEAD_BYTES = 64 * 1024
"""A head larger than this is answered 431 (gunicorn's own limits are 4094 bytes for the request
line and 100 fields of 8190: a legitimate head is far below)."""
PREREAD_BODY_MAX = 64 * 1024
"""A body of known length up to this is read with the head, so its thread never waits on it."""
MAX_HEADS_PER_CLIENT = 64
"""Connections of one client address waiting for their head; beyond, its oldest is closed."""
RECV_BYTES = 65536

_CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:[ \t]*(\d{1,12})[ \t]*(?=\r?\n)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r?\ntransfer-encoding[ \t]*:", re.IGNORECASE)
_EXPECT = re.compile(rb"\r?\nexpect[ \t]*:", re.IGNORECASE)


def _host(client) -> object:
    """A caller's address without its port (a unix socket's peer is a string)."""
    return client[0] if isinstance(client, tuple) else client


class TimedSocket(socket.socket):
    """A socket whose blocking mode carries `IO_TIMEOUT_S`: gunicorn sets a connection blocking
    before a request thread reads it (`setblocking(True)`, which would mean no timeout at all)."""

    def setblocking(self, flag: bool) -> None:
        self.settimeout(IO_TIMEOUT_S if flag else 0.0)


def head_state(data: bytes) -> str:
    """`more` (keep gathering), `ready` (the head is whole, and a small body of known length
    too) or `too_large`."""
    end = data.find(b"\r\n\r\n")
    sep = 4
    if end < 0:
        end, sep = data.find(b"\n\n"), 2
    if end < 0:
        return "too_large" if len(data) > MAX_HEAD_BYTES else "more"
    if end > MAX_HEAD_BYTES:
        return "too_large"
    head = data[: end + sep]
    if _CHUNKED.search(head) or _EXPECT.search(head):
        return "ready"  # a thread reads the chunks, or answers `100 Continue` first: under `IO_TIMEOUT_S`
    lengths = _CONTENT_LENGTH.findall(head)
    if len(lengths) != 1:
        return "ready"  # none, or several: gunicorn's parser decides (400 for a conflict)
    length = int(lengths[0])
    if length > PREREAD_BODY_MAX:
        return "ready"
    return "ready" if len(data) - len(head) >= length else "more"


class HeadGuard:
    """The mixin over gunicorn's `ThreadWorker` that reads heads in the poller (see the module)."""

    def init_process(self):
        self._heads: OrderedDict[int, tuple[object, float]] = OrderedDict()  # id(conn) -> (conn, deadline)
        super().init_process()

    # -- where connections come from --------------------------------------------------------
    def accept(self, listener):
        try:
            raw, client = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        sock = TimedSocket(fileno=raw.detach())
        from gunicorn.workers.gthread import TConn

        conn = TConn(self.cfg, sock, client, listener.getsockname())
        conn.head = b""
        self._wait_for_head(conn)

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request: its head is gathered here too."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        conn.head = b""
        self._wait_for_head(conn)

    def enqueue_req(self, conn):
        """A connection whose parser holds read-ahead that is not a whole head (a pipelined
        request cut short) waits for the rest in the poller, not in a thread."""
        if getattr(conn, "head", None) is None and conn.initialized:
            ahead = conn.parser.unreader.buf.getvalue()
            if ahead and head_state(ahead) == "more":
                conn.parser.unreader.take_buffered()
                conn.head = ahead
                conn.sock.setblocking(False)
                self._wait_for_head(conn)
                return
        super().enqueue_req(conn)

    def handle(self, conn):
        head = getattr(conn, "head", None)
        if head is not None:  # gathered by the poller: gunicorn's parser reads it first
            conn.head = None
            conn.data_ready = True
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(head)
        return super().handle(conn)

    # -- the poller's side ------------------------------------------------------------------
    def _wait_for_head(self, conn) -> None:
        conn.sock.setblocking(False)
        self._heads[id(conn)] = (conn, time.monotonic() + HEADER_TIMEOUT_S)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_bytes, conn))
        self._bound_client(conn.client)
        if conn.head and head_state(conn.head) != "more":  # read ahead whole already
            self._on_head_bytes(conn, conn.sock)

    def _on_head_bytes(self, conn, _sock) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            data = None
        except OSError:
            self._drop(conn)
            return
        if data == b"":  # closed by the caller
            self._drop(conn)
            return
        if data:
            conn.head += data
        state = head_state(conn.head)
        if state == "more":
            return
        if state == "too_large":
            self._drop(conn, b"431 Request Header Fields Too Large")
            return
        self._forget(conn)
        self.enqueue_req(conn)  # through the subclasses' own (the lingering threads' wake-up)

    def _forget(self, conn) -> None:
        self._heads.pop(id(conn), None)
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass

    def _drop(self, conn, status: bytes | None = None) -> None:
        self._forget(conn)
        if status is not None:
            body = status.split(b" ", 1)[1] + b"\n"
            answer = b"HTTP/1.1 %s\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
            try:
                conn.sock.send(answer % (status, len(body), body))  # best effort: never blocks
            except OSError:
                pass
        self.nr_conns -= 1
        conn.close()

    def _bound_client(self, client) -> None:
        """At most `MAX_HEADS_PER_CLIENT` heads of one address wait: the oldest goes."""
        host = _host(client)
        mine = [c for c, _ in self._heads.values() if _host(c.client) == host]
        for conn in mine[: max(0, len(mine) - MAX_HEADS_PER_CLIENT)]:
            self._drop(conn, b"408 Request Timeout")

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self._heads:
            conn, deadline = next(iter(self._heads.values()))
            if deadline > now:
                break
            self._drop(conn, b"408 Request Timeout")

    def set_accept_enabled(self, enabled):
        """At the connection limit, the longest-waiting head (else the longest-idle kept-alive
        connection) is closed so that new callers are still accepted."""
        if self.alive and not enabled and (self._heads or self.keepalived_conns):
            excess = self.nr_conns - self.worker_connections + 1
            while excess > 0 and self._heads:
                self._drop(next(iter(self._heads.values()))[0], b"408 Request Timeout")
                excess -= 1
            while excess > 0 and self.keepalived_conns:
                conn = self.keepalived_conns.popleft()
                try:
                    self.poller.unregister(conn.sock)
                except (KeyError, ValueError, OSError):
                    pass
                self.nr_conns -= 1
                conn.close()
                excess -= 1
            enabled = self.nr_conns < self.worker_connections
        super().set_accept_enabled(enabled)
