"""http mode: every request forwarded to the function's own HTTP server (`upstream_url`) over one
kept-alive connection per serving thread, within the request's timeout."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .front import Handler

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
}


class Upstream:
    """The function's server: whether it accepts connections, and each thread's connection to it."""

    def __init__(self, url: str):
        up = urlsplit(url)
        self.address = (up.hostname or "127.0.0.1", up.port or 80)
        self.local = threading.local()

    def up(self) -> bool:
        try:
            with socket.create_connection(self.address, timeout=0.5):
                return True
        except OSError:
            return False

    def conn(self, timeout: float | None) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(*self.address, timeout=timeout)
            self.local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def drop(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()
            self.local.conn = None


def proxy(h: Handler, body: bytes, t0: float) -> int:
    """Forward the request `h` is serving; answer with the upstream's response (504 on timeout,
    500 when it cannot be reached); returns the status sent."""
    wd = h.wd
    upstream = wd.upstream
    timeout = h.request_timeout() or None
    headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
    headers.pop("Content-Length", None)
    headers["Content-Length"] = str(len(body))
    for attempt in (1, 2):
        conn = upstream.conn(timeout)
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            sock = conn.sock  # the response may take the connection over (http.client's will_close)
            resp = conn.getresponse()
            data = None if _streamed(resp, h.command) else resp.read()
            break
        except TimeoutError:
            upstream.drop()
            h.function_answered = False  # of-watchdog logs its own line for these, not the call's
            msg = f"Timeout after {time.monotonic() - t0:.3f}s waiting for the function\n"
            h.reply(504, msg.encode(), [("X-Duration-Seconds", f"{time.monotonic() - t0:.6f}")])
            return 504
        except (OSError, http.client.HTTPException) as exc:
            upstream.drop()
            # a kept-alive upstream connection may have been closed meanwhile: retry once
            if attempt == 2 or not isinstance(
                exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError
            ):
                h.function_answered = False
                h.reply(
                    500,
                    f"Can't reach service for: {exc}\n".encode(),
                    [("X-OpenFaaS-Internal", "of-watchdog")],
                )
                return 500
    if resp.will_close:
        upstream.drop()
    out = [(k, v) for k, v in resp.getheaders() if k.lower() != "x-duration-seconds"]
    out.append(("X-Duration-Seconds", f"{time.monotonic() - t0:.6f}"))  # a stream's: to its head
    if data is None:
        return _relay(h, resp, sock, out, t0 + timeout if timeout else None)
    h.reply(resp.status, data, out, content_type=wd.cfg.content_type)
    return resp.status


def _streamed(resp: http.client.HTTPResponse, method: str) -> bool:
    """An upstream answer without a length (chunked, or to the connection's end) is a stream:
    index.py's waitress sends a Content-Length for every whole answer."""
    if method == "HEAD" or resp.status in (204, 304) or resp.status < 200:
        return False
    return bool(resp.chunked) or resp.length is None


def _relay(h: Handler, resp: http.client.HTTPResponse, sock: socket.socket, headers, deadline: float | None) -> int:
    """Relay a streamed upstream answer chunk by chunk as it arrives (`streams`), the whole of it
    within the request's timeout, the writes to the caller too (one that stops reading is cut at
    the timeout, not at the connection's own, minutes later); the upstream connection is kept
    only after a whole answer."""
    from .streams import Stream, pump

    caller = h.connection
    caller_timeout = caller.gettimeout()

    def chunks():
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return  # cut_reason says why
                sock.settimeout(left)
            data = resp.read1(65536)
            if not data:
                return
            if deadline is not None:  # at least a moment: 0 would make the socket non-blocking
                caller.settimeout(max(0.001, deadline - time.monotonic()))
            yield data

    def cut_reason() -> str | None:
        if deadline is not None and time.monotonic() >= deadline:
            return "the exec timeout passed"
        return None

    stream = Stream(h)
    stream.head(resp.status, headers, h.wd.cfg.content_type)
    try:
        whole = pump(
            h,
            stream,
            chunks(),
            cut_reason=cut_reason,
            on_error=lambda exc: f"the function's answer ended early ({type(exc).__name__}: {exc})",
        )
    finally:
        try:  # the connection's next request is read within its own timeout again
            caller.settimeout(caller_timeout)
        except OSError:
            pass
    h.sent = stream.sent
    if not whole or resp.will_close:
        h.wd.upstream.drop()  # mid-answer: closing it is how the function's server learns the caller went
    return resp.status
