"""Streamed answers: a function's answer sent as it is produced, chunk by chunk, instead of whole.

A handler whose answer's body is an iterator (python3-gpu's index.py turns a generator of str or
bytes into one) is answered here in inproc mode; in http mode, an upstream answer that is chunked
or delimited by the connection's end is relayed the same way (`proxy`). The rules, the same in
both modes:
- the status line and headers go first, with `Transfer-Encoding: chunked` and never a
  `Content-Length` (an HTTP/1.0 caller gets the bytes as they come and the connection's end);
- each item is one chunk, written as soon as the function yields it (an empty item is skipped:
  a zero-length chunk would end the answer);
- the answer ends with the last chunk (`0\\r\\n\\r\\n`) only when the function's iterator ended; a
  function that raises mid-stream, yields an item that is not str or bytes, or runs past its exec
  timeout has its stream **cut**: the connection is closed without the last chunk, so the caller
  sees an incomplete answer rather than a short one that looks whole, as a reverse proxy aborts
  an answer whose upstream died mid-body. Each cut is logged with its reason;
- a caller that goes away (its connection closed, seen after each chunk) has the function's
  iterator closed (`close()`: a generator gets GeneratorExit at its `yield`), so a model that
  generates tokens stops at its next one instead of running to the end for nobody.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from .logs import log

if TYPE_CHECKING:
    from .front import Handler

_GONE = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
_NO_BODY_STATUS = frozenset({204, 304})


class StreamCut(Exception):
    """The stream must end without its last chunk; the message says why (logged)."""


class ClientGone(Exception):
    """The caller closed its connection mid-stream."""


def is_stream(body: object) -> bool:
    """Whether a function's answer body is to be streamed: anything iterable that is not bytes."""
    return not isinstance(body, bytes | bytearray | memoryview | str) and hasattr(body, "__iter__")


def as_bytes(item: object, index: int) -> bytes:
    """One streamed item on the wire: bytes as they are, str as UTF-8; anything else is a cut."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    raise StreamCut(f"item {index} of the streamed body is {type(item).__name__}, not str or bytes")


def client_gone(conn: socket.socket) -> bool:
    """After a chunk: has the caller closed its side? Nothing is read (a pipelined request stays)."""
    poller = select.poll()
    poller.register(conn, select.POLLIN | _GONE)
    events = poller.poll(0)
    if not events:
        return False
    mask = events[0][1]
    if mask & _GONE:
        return True
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Stream:
    """One streamed answer on the connection `h` serves."""

    def __init__(self, h: Handler):
        self.h = h
        self.chunked = h.request_version != "HTTP/1.0"
        self.body = h.command != "HEAD"
        self.sent = 0

    def head(self, code: int, headers: list[tuple[str, str]], content_type: str) -> None:
        """The status line and headers, sent before the first chunk (flushed: the caller knows the
        status at once); the function's own Date and Server win, as in a whole answer."""
        h = self.h
        if code in _NO_BODY_STATUS or code < 200:
            self.body = False
        h.head(code, headers, content_type)
        if self.body and self.chunked:
            h.send_header("Transfer-Encoding", "chunked")
        elif self.body:  # HTTP/1.0: the body ends with the connection
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()

    def send(self, data: bytes) -> None:
        if not data or not self.body:
            return
        h = self.h
        h.wfile.write(b"%X\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        h.wfile.flush()
        self.sent += len(data)
        if client_gone(h.connection):
            raise ClientGone

    def end(self) -> None:
        if self.body and self.chunked:
            self.h.wfile.write(b"0\r\n\r\n")
            self.h.wfile.flush()

    def cut(self) -> None:
        """Close the connection without the last chunk: the caller sees an incomplete answer."""
        h = self.h
        h.close_connection = True
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(
    h: Handler,
    stream: Stream,
    items: Iterable[object],
    *,
    cut_reason: Callable[[], str | None] = lambda: None,
    on_error: Callable[[BaseException], str] = lambda exc: f"the function raised {type(exc).__name__}: {exc}",
) -> bool:
    """Send `items` as chunks after `stream.head`; True when the answer ended whole.

    `cut_reason` is asked after each item and after a failed write: a reason (the exec timeout
    passed) cuts the stream. `on_error` words an exception the items raise. The items' iterator is
    closed whatever happens, so a generator's `finally` runs and a model stops generating."""
    iterator: Iterator[object] = iter(items)
    index = 0
    try:
        while stream.body:  # a HEAD, a 204 or a 304 has no body: the function's iterator is not run
            try:
                item = next(iterator)
            except StopIteration:
                break
            except StreamCut:
                raise
            except Exception as exc:  # noqa: BLE001 — the function's failure mid-stream: a cut
                reason = cut_reason()
                raise StreamCut(reason or on_error(exc)) from exc
            reason = cut_reason()
            if reason:
                raise StreamCut(reason)
            try:
                stream.send(as_bytes(item, index))
            except OSError as exc:
                reason = cut_reason()
                if reason:
                    raise StreamCut(reason) from exc
                raise ClientGone from exc
            index += 1
        reason = cut_reason()
        if reason:
            raise StreamCut(reason)
        stream.end()
        return True
    except StreamCut as cut:
        log(f"Stream cut after {stream.sent} bytes: {cut}")
        stream.cut()
        return False
    except (ClientGone, OSError):
        log(f"Client went away after {stream.sent} bytes of a streamed answer; the function's stream was closed")
        h.close_connection = True
        return False
    finally:
        close = getattr(items, "close", None) or getattr(iterator, "close", None)  # a WSGI iterable's own
        if close is not None:
            try:
                close()
            except Exception as exc:  # noqa: BLE001 — a generator that raises on close: logged, nothing more
                log(f"Closing the function's stream raised {type(exc).__name__}: {exc}")
