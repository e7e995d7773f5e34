"""A replica's streamed answer, sent on to the caller as it arrives (the gateway's `/function/*`).

A replica streams an answer when its function's body is a generator (python3-gpu's watchdog
sends it chunked, with no length). The gateway reads such an answer's head, answers the caller
with the same status and headers at once (no `Content-Length`: gunicorn sends it chunked), then
hands each piece on as soon as it is read: nothing is gathered, whatever the content type
(`text/event-stream` included), as the CE gateway's streaming proxy flushes each write. An
answer with a length (every whole answer) keeps the fast path and is read whole.

The call is in flight until the stream ends: its in-flight slot, the dispatcher's count and the
gateway's metrics (its duration, counted when it ends) are released by `close`, which the WSGI
server calls whether the stream ended whole, broke, or the caller went away. When the replica's
stream breaks (cut short, or past the call's timeout) the caller's connection is closed without
the last chunk, so the caller sees an incomplete answer; the call is never resent once its answer
has begun. A caller that goes away closes the replica's connection, which is how the replica's
watchdog learns it and closes the function's generator.

A caller that stops reading (its connection open, its window shut) would hold the write of the
next piece, the request thread and the in-flight slot forever: the replica's side ends at the
call's timeout, but nothing bounds the gateway's own write. So each piece is written to the
caller within what is left of the call's timeout (`bind`: the caller's socket gets that timeout
before each piece); past it the write fails, the server drops the connection and `close` frees
the slot, as for a caller that went away.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable, Iterator

from .upstream import ReplicaError, ReplicaStream

log = logging.getLogger(__name__)


class StreamCut(ConnectionResetError):
    """Raised into the WSGI server when the replica's stream broke: gunicorn then closes the
    caller's connection without the last chunk, quietly (a reset is no server error)."""


class StreamedAnswer:
    """The WSGI iterable of one streamed answer."""

    __slots__ = ("body", "label", "sent", "whole", "_finishers", "_closed", "_caller")

    def __init__(self, body: ReplicaStream, label: str):
        self.body = body
        self.label = label
        self.sent = 0
        self.whole = False
        self._finishers: list[Callable[[bool], None]] = []
        self._closed = False
        self._caller: socket.socket | None = None

    def bind(self, caller: socket.socket | None) -> None:
        """The caller's connection, whose writes are then bounded by the call's deadline."""
        self._caller = caller

    def _bound_next_write(self) -> None:
        if self._caller is None:
            return
        try:  # at least a moment: 0 would make the socket non-blocking, not bounded
            self._caller.settimeout(max(0.001, self.body.deadline - time.monotonic()))
        except OSError:  # closed under us: the write itself says so
            pass

    def at_end(self, finish: Callable[[bool], None]) -> None:
        """Call `finish(whole)` when the stream ends (last registered, first called)."""
        self._finishers.append(finish)

    def __iter__(self) -> Iterator[bytes]:
        try:
            for piece in self.body:
                self.sent += len(piece)
                self._bound_next_write()
                yield piece
        except ReplicaError as exc:
            log.warning("%s: its streamed answer was cut after %d bytes: %s", self.label, self.sent, exc)
            raise StreamCut(errno.ECONNRESET, f"the replica's streamed answer was cut: {exc}") from exc
        self.whole = True

    def whole_body(self) -> bytes:
        """The whole body (for a callback, which posts a body with a length); ReplicaError when
        the stream breaks."""
        parts = []
        try:
            for piece in self.body:
                self.sent += len(piece)
                parts.append(piece)
            self.whole = True
        finally:
            self.close()
        return b"".join(parts)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.body.close()
        if self._caller is not None:
            try:  # the connection's next request (kept alive) is read without the call's bound
                self._caller.settimeout(None)
            except OSError:
                pass
        for finish in reversed(self._finishers):
            try:
                finish(self.whole)
            except Exception:  # one bookkeeping failure must not skip the others (the in-flight slot)
                log.exception("%s: finishing a streamed call failed", self.label)
