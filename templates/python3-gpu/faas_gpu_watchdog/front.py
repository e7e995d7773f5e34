"""The HTTP front: the watchdog's server, its routes (`/_/health`, `/_/ready`, everything else to
the function), the request body's limit and the concurrency limit (`max_inflight`). Requests are
read by `request_head` (not the e-mail package)."""

from __future__ import annotations

import email.utils
import http.client
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from .durations import request_timeout
from .fork import fork
from .inproc import serve_inproc
from .logs import log
from .proxy import HOP_BY_HOP, proxy
from .request_head import parse_request
from .status import reason, request_line

if TYPE_CHECKING:
    from .watchdog import Watchdog

_date: tuple[int, str] = (0, "")
"""The last `Date` value made, by its second: formatting one costs as much as the rest of the
answer's head (`email.utils.formatdate`), and every answer of a second carries the same."""


def http_date() -> str:
    global _date
    now = int(time.time())
    made = _date  # one read: another thread may replace it meanwhile, with this second's or the next's
    if made[0] != now:
        made = _date = (now, email.utils.formatdate(now, usegmt=True))
    return made[1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fwatchdog"
    sys_version = ""
    wd: Watchdog

    sent = 0
    """The body length of the last answer written (of-watchdog's per-request line logs it)."""
    function_answered = True
    """Whether the call's answer came from the function (http mode logs a line only then)."""

    def log_message(self, format, *args):  # noqa: A002 — http.server's access lines: of-watchdog has its own
        pass

    def send_response_only(self, code, message=None):
        """The status line with Go's reason phrase, whatever reason the caller had in mind
        (`send_error` passes its explanation as the reason; Go writes `400 Bad Request`)."""
        super().send_response_only(code, reason(code))

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK cost 40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.settimeout(self.wd.cfg.read_timeout + self.wd.cfg.write_timeout + 60)

    def parse_request(self) -> bool:
        return parse_request(self)

    # -- plumbing ------------------------------------------------------------------------
    def reply(
        self,
        code: int,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
        content_type: str = "text/plain; charset=utf-8",
        close: bool = False,
    ) -> None:
        self.head(code, headers, content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
        # end_headers + write, in one send: the caller reads the head and the body in one
        # receive, and no second system call here (issue 20's CPU a request)
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(body)
        self.sent = len(body)
        self.flush_headers()

    def head(self, code: int, headers: list[tuple[str, str]] | None, content_type: str) -> None:
        """An answer's status line and headers, buffered; the caller adds its framing (a
        Content-Length, or a stream's `Transfer-Encoding`) and ends them."""
        # the upstream's own Date and Server win (of-watchdog copies them and Go adds a Date only
        # when none is set); BaseHTTPRequestHandler.send_response would add a second of each
        upstream = {k.lower() for k, _ in headers or ()}
        self.log_request(code)
        self.send_response_only(code)
        if "server" not in upstream:
            self.send_header("Server", self.version_string())
        if "date" not in upstream:
            self.send_header("Date", http_date())
        has_ct = False
        for k, v in headers or ():
            if k.lower() in HOP_BY_HOP or k.lower() == "content-length":
                continue
            has_ct = has_ct or k.lower() == "content-type"
            self.send_header(k, v)
        if not has_ct:
            self.send_header("Content-Type", content_type)

    def request_timeout(self) -> float:
        """This request's timeout in seconds (0: none)."""
        return request_timeout(self.wd.cfg.exec_timeout, self.headers.get("X-Timeout"))

    def _body(self) -> bytes | None:
        limit = self.wd.cfg.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks, total = [], 0
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > limit:
                    return None
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            return None
        return self.rfile.read(length) if length else b""

    # -- routing -------------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        self.route()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = do_GET  # noqa: N815

    def route(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/_/health":
            return self.health()
        if path == "/_/ready":
            return self.ready()
        wd = self.wd
        with wd.inflight_lock:
            if wd.cfg.max_inflight and wd.inflight >= wd.cfg.max_inflight:
                over = True
            else:
                over = False
                wd.inflight += 1
        if over:
            self._body()
            return self.reply(429, b"Concurrent request limit exceeded.\n")
        if wd.metrics.enabled:
            wd.metrics.in_flight.inc()
        t0 = time.monotonic()
        code = 500
        try:
            body = self._body()
            if body is None:
                code = 413
                self.close_connection = True
                return self.reply(413, f"request body is larger than {wd.cfg.max_body_bytes} bytes\n".encode())
            self.function_answered = True
            if wd.cfg.mode == "inproc":
                code = serve_inproc(self, body, t0)
            elif wd.cfg.mode == "http":
                code = proxy(self, body, t0)
            else:
                code = fork(self, body, t0)
            self.log_call(code, time.monotonic() - t0)
        finally:
            with wd.inflight_lock:
                wd.inflight -= 1
                wd.drained.notify_all()
            if wd.metrics.enabled:
                wd.metrics.in_flight.dec()
            wd.metrics.observe(code, self.command, time.monotonic() - t0)

    def log_call(self, code: int, seconds: float) -> None:
        """of-watchdog's one line per call, once the function answered (none for a kubelet's
        probe, whose User-Agent starts `kube-probe`; the classic watchdog has its own lines)."""
        mode = self.wd.cfg.mode
        if mode == "classic" or not self.function_answered:
            return
        if (self.headers.get("User-Agent") or "").startswith("kube-probe"):
            return
        call_id = (self.headers.get("X-Call-Id") or "none") if self.wd.cfg.log_callid else None
        text = mode in ("http", "inproc")
        log(request_line(self.command, self.path, code, self.sent, seconds, text=text, call_id=call_id))

    def health(self) -> None:
        if self.command != "GET":
            return self.reply(405, b"Method not allowed\n")
        if self.wd.accepting and self.wd.lock_present():
            return self.reply(200, b"OK")
        return self.reply(503, b"Service Unavailable\n")

    def ready(self) -> None:
        wd = self.wd
        if self.command != "GET":
            return self.reply(405, b"Method not allowed\n")
        if not (wd.accepting and wd.lock_present()):
            return self.reply(503, b"Service Unavailable\n")
        if wd.cfg.max_inflight and wd.inflight >= wd.cfg.max_inflight:
            return self.reply(429, b"Concurrent request limit exceeded.\n")
        if wd.cfg.mode == "inproc" and not wd.function.loaded.is_set():
            return self.reply(503, b"function not loaded yet\n")
        if wd.cfg.mode == "http" and not wd.upstream.up():
            return self.reply(503, b"upstream not ready\n")
        if wd.cfg.ready_path and wd.cfg.mode == "inproc":
            # of-watchdog calls its function handler with ready_path in every mode (pkg/readiness.go):
            # here that is the function in this process
            try:
                status, headers, data = wd.function.call("GET", wd.cfg.ready_path, "", self.headers, b"")
            except Exception as exc:  # noqa: BLE001 — a check that raises says the function cannot serve
                return self.reply(500, f"ready_path {wd.cfg.ready_path} raised {type(exc).__name__}: {exc}\n".encode())
            return self.reply(status, data if isinstance(data, bytes) else bytes(data), headers)
        if wd.cfg.ready_path and wd.cfg.mode == "http":
            try:
                conn = http.client.HTTPConnection(*wd.upstream.address, timeout=5)
                conn.request("GET", wd.cfg.ready_path)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                return self.reply(resp.status, data, resp.getheaders())
            except OSError:
                return self.reply(503, b"upstream not ready\n")
        return self.reply(200, b"OK")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # socketserver's 5 refuses bursts; Go's listener (of-watchdog) takes SOMAXCONN

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-request is no error worth a traceback in the function's log."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)
