"""One kept-alive HTTP/1.1 client connection, its answers read without the e-mail package.

The two hops a request takes through Python clients, the gateway's forward to a replica and an
instance's batch to its leased GPU Manager, spent much of their CPU in the client library rather
than on the wire (issue 20): `http.client` parses every answer's headers with the e-mail package's
feed parser, and `requests` adds its session, adapter, URL and cookie work on top (~20% of an
instance's CPU at batch 8, profiled). This sends a request with one `sendall` and reads the
answer with the socket's buffered reader: the status line, the header lines split at the first
colon, the body by `Content-Length`, chunks, or the connection's end, as RFC 9112 frames them.

What it answers to a peer that misbehaves, so that callers map it as they mapped `http.client`'s
errors:
- the connection closed before the first byte of an answer: `RemoteClosed` (a
  `ConnectionResetError`, as `http.client.RemoteDisconnected` is): a kept-alive connection the
  peer closed while it idled;
- an answer that is not HTTP/1.x, a line over 64 KiB, over 100 header lines, a bad length or
  chunk, or a body cut short: `ProtocolError`;
- no byte within the timeout: `TimeoutError`; anything else the socket raises, as it raises it.

The timeout is the kernel's (`SO_RCVTIMEO`, `SO_SNDTIMEO` on a blocking socket), not Python's: a
socket with a Python timeout polls before every send and receive, a second system call and a
second release of the GIL each time, and in the gateway's many request threads each release is a
likely hand-over to another thread (issue 20). Each send or receive waits at most the timeout.
"""

from __future__ import annotations

import io
import select
import socket
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_LINE = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS
_NO_BODY_METHODS = frozenset({"HEAD"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # http.client sends Content-Length: 0 for these


class ProtocolError(Exception):
    """The peer's answer is not HTTP/1.x as RFC 9112 frames it, or was cut short."""


class RemoteClosed(ConnectionResetError):
    """The connection ended before the first byte of an answer."""


@dataclass(slots=True)
class Answer:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    """As sent, in order, repeats kept."""
    body: bytes
    will_close: bool
    """The peer closes the connection after this answer (`Connection: close`, HTTP/1.0, or a
    body delimited by the connection's end)."""
    stream: BodyStream | None = None
    """With `read_answer(stream=True)`, a body without a length (chunked, or to the connection's
    end) is not read: `body` is empty and this reads it as it arrives."""

    def header(self, name: str) -> str | None:
        """The first value of `name` (case-insensitive), or None."""
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)


class Connection:
    """A client connection to one `host:port`, reused across requests until either side closes it.
    Not thread-safe: one request at a time (callers keep one per thread)."""

    __slots__ = ("host", "port", "timeout", "sock", "_reader", "_poller", "_host_header")

    def __init__(self, host: str, port: int, timeout: float | None = None):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self._reader = None
        self._poller: select.poll | None = None
        name = f"[{host}]" if ":" in host else host
        self._host_header = name if port == 80 else f"{name}:{port}"  # as http.client writes it

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _kernel_timeout(sock, self.timeout)
        self.sock, self._reader = sock, io.BufferedReader(_Receiver(sock))
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    def settimeout(self, timeout: float | None) -> None:
        if self.sock is not None and timeout != self.timeout:
            _kernel_timeout(self.sock, timeout)
        self.timeout = timeout

    def close(self) -> None:
        sock, reader = self.sock, self._reader
        self.sock = self._reader = self._poller = None
        if reader is not None:
            reader.close()
        if sock is not None:
            sock.close()

    def dropped(self) -> bool:
        """An idle kept-alive connection has nothing to read: readable means the peer closed it
        (EOF), reset it, or sent bytes no request asked for. One `poll(0)` system call."""
        return self.sock is None or self._poller is None or bool(self._poller.poll(0))

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
    ) -> Answer:
        """Send one request and read its whole answer (connecting first when not connected). The
        request's head is what `http.client` would send: a `Host` and `Accept-Encoding: identity`
        unless given, `Content-Length` for a body (0 for a POST, PUT or PATCH without one)."""
        self.send(method, target, headers, body)
        return self.read_answer(method)

    def send(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
    ) -> None:
        """The request alone (`request`'s first half): a caller that must tell a failure to send
        from one to read the answer calls the halves itself."""
        if self.sock is None:
            self.connect()
        items = headers.items() if isinstance(headers, Mapping) else headers
        lines = [f"{method} {target} HTTP/1.1"]
        named: set[str] = set()
        for k, v in items:
            named.add(k.lower())
            lines.append(f"{k}: {v}")
        if "host" not in named:
            lines.insert(1, f"Host: {self._host_header}")
        if "accept-encoding" not in named:
            lines.append("Accept-Encoding: identity")
        if "content-length" not in named and "transfer-encoding" not in named:
            if body is not None:
                lines.append(f"Content-Length: {len(body)}")
            elif method in _BODY_METHODS:
                lines.append("Content-Length: 0")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        sock = self.sock
        assert sock is not None
        try:
            if body and len(body) <= 65536:
                sock.sendall(head + body)
            else:
                sock.sendall(head)
                if body:
                    sock.sendall(body)
        except BlockingIOError:  # SO_SNDTIMEO ran out (EAGAIN on a blocking socket)
            raise TimeoutError("timed out sending the request") from None

    # -- the answer ---------------------------------------------------------------------------
    def _line(self, first: bool = False) -> bytes:
        try:
            line = self._reader.readline(MAX_LINE + 1)
        except ConnectionResetError as exc:
            if first:  # reset before any byte of an answer: closed while it idled, as an EOF is
                raise RemoteClosed(f"the connection was reset before an answer: {exc}") from exc
            raise
        if len(line) > MAX_LINE:
            raise ProtocolError("a line of the answer is over 64 KiB")
        if not line:
            if first:
                raise RemoteClosed("the connection closed before an answer")
            raise ProtocolError("the connection closed inside the answer's head")
        return line

    def read_answer(self, method: str, stream: bool = False) -> Answer:
        """The answer to the request just sent (`method` says whether it has a body). `stream`:
        a body without a length is left to `Answer.stream`, read as it arrives; a body with a
        Content-Length is read whole either way."""
        first = True
        while True:
            status_line = self._line(first)
            first = False
            try:
                version, status_text, reason = (status_line.decode("latin-1").rstrip("\r\n").split(" ", 2) + [""])[:3]
                status = int(status_text)
            except ValueError:
                raise ProtocolError(f"not a status line: {status_line[:80]!r}") from None
            if not version.startswith("HTTP/1.") or not 100 <= status <= 999 or len(status_text) != 3:
                raise ProtocolError(f"not a status line: {status_line[:80]!r}")
            headers = self._headers()
            if status >= 200 or status == 101:
                break  # an interim answer (100 Continue, 103 Early Hints) is read past, as http.client does
        connection = ""
        length: str | None = None
        chunked = False
        for k, v in headers:
            low = k.lower()
            if low == "content-length":
                length = v if length is None or length == v else "conflict"
            elif low == "transfer-encoding":
                chunked = v.strip().lower().endswith("chunked")
            elif low == "connection":
                connection += "," + v.lower()
        will_close = version == "HTTP/1.0" and "keep-alive" not in connection or "close" in connection
        if method in _NO_BODY_METHODS or status in (204, 304) or status < 200:
            return Answer(status, reason, headers, b"", will_close)
        if chunked:
            if stream:
                return Answer(status, reason, headers, b"", will_close, BodyStream(self, chunked=True))
            body = self._chunked()
        elif length is not None:
            body = self._exact(_length(length))
        else:  # delimited by the connection's end
            if stream:
                return Answer(status, reason, headers, b"", True, BodyStream(self, chunked=False))
            body = self._reader.read()
            will_close = True
        return Answer(status, reason, headers, body, will_close)

    def _headers(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while True:
            line = self._line()
            if line in (b"\r\n", b"\n"):
                return out
            if len(out) >= MAX_HEADERS:
                raise ProtocolError("over 100 header lines in the answer")
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or not name or name != name.strip() or name[0] in " \t":
                raise ProtocolError(f"not a header line: {line[:80]!r}")
            out.append((name, value.strip(" \t\r\n")))

    def _exact(self, n: int) -> bytes:
        data = self._reader.read(n) if n else b""
        if len(data) < n:
            raise ProtocolError(f"the answer's body was cut short: {len(data)} of {n} bytes")
        return data

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"not a chunk size: {size_text[:40]!r}") from None
            if size < 0:
                raise ProtocolError(f"not a chunk size: {size_text[:40]!r}")
            if size == 0:
                self._headers()  # trailers, read past
                return b"".join(parts)
            parts.append(self._exact(size))
            if self._line() not in (b"\r\n", b"\n"):
                raise ProtocolError("a chunk is longer than its size")


class BodyStream:
    """An answer's body read as it arrives, piece by piece (`read`), for answers that are
    streamed: a chunked body, or one delimited by the connection's end. A piece is what one
    receive brought of the current chunk, so a small chunk is handed on as soon as it is here.
    The connection carries nothing else until the body is read to its end (`complete`); a caller
    that stops before must close the connection."""

    __slots__ = ("_conn", "_chunked", "_left", "_started", "complete")

    def __init__(self, conn: Connection, *, chunked: bool):
        self._conn, self._chunked = conn, chunked
        self._left = 0  # bytes of the current chunk not read yet
        self._started = False
        self.complete = False

    def read(self, max_bytes: int = 65536) -> bytes:
        """The next piece of the body; b"" once it has ended (`complete`). ProtocolError when it
        is cut short or malformed, TimeoutError when nothing comes within the timeout."""
        if self.complete:
            return b""
        reader = self._conn._reader
        if reader is None:
            raise ProtocolError("the connection was closed inside the answer's body")
        if not self._chunked:
            piece = reader.read1(max_bytes)
            if not piece:
                self.complete = True
            return piece
        if self._left == 0:
            if self._started and self._line(reader) not in (b"\r\n", b"\n"):
                raise ProtocolError("a chunk is longer than its size")
            self._started = True
            size_text = self._line(reader).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"not a chunk size: {size_text[:40]!r}") from None
            if size < 0:
                raise ProtocolError(f"not a chunk size: {size_text[:40]!r}")
            if size == 0:
                self._conn._headers()  # trailers, read past
                self.complete = True
                return b""
            self._left = size
        piece = reader.read1(min(self._left, max_bytes))
        if not piece:
            raise ProtocolError(f"the answer's body was cut short inside a chunk ({self._left} bytes missing)")
        self._left -= len(piece)
        return piece

    @staticmethod
    def _line(reader) -> bytes:
        line = reader.readline(MAX_LINE + 1)
        if not line:
            raise ProtocolError("the answer's body was cut short between chunks")
        if len(line) > MAX_LINE:
            raise ProtocolError("a line of the answer is over 64 KiB")
        return line


def _kernel_timeout(sock: socket.socket, timeout: float | None) -> None:
    """`timeout` seconds for each send and receive on `sock`, kept by the kernel: the socket is
    left blocking, so Python does not poll before each call. None: no limit; 0: non-blocking, as
    Python's own `settimeout(0)`."""
    if timeout is not None and timeout <= 0:
        sock.settimeout(timeout)
        return
    sock.settimeout(None)
    whole, usec = 0, 0
    if timeout is not None:
        whole = int(timeout)
        usec = max(int((timeout - whole) * 1e6), 0 if whole else 1)  # a zero timeval is no limit at all
    tv = struct.pack("@ll", whole, usec)  # struct timeval
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


class _Receiver(io.RawIOBase):
    """The socket's bytes for a buffered reader, as `socket.makefile` gives them, but with a
    kernel timeout: a receive that runs out of it (EAGAIN on a blocking socket) is `TimeoutError`,
    never read as the connection's end."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError:
            raise TimeoutError("timed out waiting for the answer") from None


class ThreadConnections:
    """Kept-alive connections per (thread, base URL `http://host:port`). A caller's thread makes
    one call at a time, so a thread-local connection per address needs no lock and no pool; each
    thread keeps at most `kept` addresses, the least recently used closed beyond, so connections
    to peers long gone do not pile up. The gateway's forward to replicas and an instance's batches
    to its leased GPU Manager each keep one (`provider.upstream`, `faas_gpu.client`)."""

    def __init__(self, kept: int):
        self.kept = kept
        self._local = threading.local()

    def connections(self) -> OrderedDict[str, Connection]:
        """This thread's, the least recently used first."""
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = OrderedDict()
        return conns

    def get(self, base_url: str, timeout: float | None) -> tuple[Connection, bool]:
        """This thread's connection to `base_url`, now its most recently used, and whether it is a
        kept-alive one to reuse. False: a new one, or one the peer closed while it idled (closed
        here): not connected yet."""
        conns = self.connections()
        conn = conns.get(base_url)
        if conn is not None:
            conns.move_to_end(base_url)
            if not conn.dropped():
                return conn, True
            conn.close()
            return conn, False
        parts = urlsplit(base_url)
        conn = conns[base_url] = Connection(parts.hostname or "", parts.port or 80, timeout)
        while len(conns) > self.kept:
            conns.popitem(last=False)[1].close()
        return conn, False

    def forget(self, base_url: str, conn: Connection) -> None:
        """`conn` closed, and no longer this thread's connection to `base_url` (it failed, or its
        answer ended the connection)."""
        conn.close()
        conns = self.connections()
        if conns.get(base_url) is conn:
            del conns[base_url]


def _length(text: str) -> int:
    if text == "conflict" or not text.strip().isdigit():
        raise ProtocolError(f"not a Content-Length: {text[:40]!r}")
    return int(text)
