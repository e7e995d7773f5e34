"""What every faas-gpu daemon serves with: one gunicorn gthread worker (`LingeringThreadWorker`), and a
bearer-token guard.

One worker, many threads: each daemon keeps live state (replicas, worker processes, queues) in
that worker's memory, so the app is built in the worker (`load`) and closed when it exits.
"""

from __future__ import annotations

import hmac
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, Response
from flask import request as flask_request
from gunicorn import util as gunicorn_util
from gunicorn.app.base import BaseApplication
from gunicorn.http.body import LengthReader
from gunicorn.workers.gthread import ThreadWorker

from faas_gpu.slow_clients import MAX_HEAD_BYTES, PREREAD_BODY_MAX, HeadGuard, head_state

LINGER_S = 0.2
"""How long a request thread waits on its kept-alive connection for the next request before it
gives the connection back to gunicorn's poller (`LingeringThreadWorker`)."""
LINGER_SLICE_S = 0.025
"""While it lingers, the thread also looks this often whether it should stop (the worker's end,
the linger's end, work queued while no wake-up was sent)."""


class LingeringThreadWorker(HeadGuard, ThreadWorker):
    """gunicorn's gthread worker, whose request thread serves the next request of a kept-alive
    connection itself when it comes within `LINGER_S`; request heads are read by the poller, never
    by a thread (`faas_gpu.slow_clients`).

    Why: gthread hands every kept-alive connection back to its main thread after each request
    (a pipe write, an epoll wake-up, a register, then a submit to the pool and a second thread's
    wake-up on the next request): ~0.1-0.2 ms of CPU a request on the path of every call (issue
    20), where a caller that sends its next call on the same connection at once is the common
    case (the gateway's callers, the instances' persistent connection to their GPU Manager).
    Nothing else changes: the same parser, WSGI environ, keep-alive and close rules per request.
    A lingering thread gives its connection back as soon as other work waits for a thread: the
    main thread, queueing a connection while some thread lingers, writes a byte to a wake-up pipe
    every lingering thread polls beside its connection, and the one that reads it gives way at
    once (not at its next slice: under an open loop's many connections a slice's wait a request
    would cost the gateway its capacity). It also gives way when the worker stops, and after
    `LINGER_S` without a request."""

    def init_process(self):
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lingering = 0  # threads lingering now (read by the main thread without a lock: a hint)
        self._linger_lock = threading.Lock()
        super().init_process()  # runs the worker: last

    def enqueue_req(self, conn):
        super().enqueue_req(conn)
        if self._lingering:  # a thread idles on its own connection: this work wants it
            try:
                os.write(self._wake_w, b"\0")
            except OSError:  # the pipe is full of wake-ups already
                pass

    def _keepalive_after(self, conn, keepalive):
        """A body the app read to its end leaves nothing to drain: said at once, without gunicorn's
        deadline-bounded drain (two `settimeout` system calls and a read, ~5% of a request's CPU
        in a gthread worker); anything else is drained as gunicorn drains it."""
        if keepalive:
            body = getattr(conn.parser.mesg, "body", None)
            reader = getattr(body, "reader", None)
            if type(reader) is LengthReader and reader.length == 0 and body.buf.tell() == 0:
                return True
        return super()._keepalive_after(conn, keepalive)

    def handle(self, conn):
        result = super().handle(conn)
        while result is True and self._next_request_soon(conn):
            result = super().handle(conn)
        return result

    def _next_request_soon(self, conn) -> bool:
        """True when the connection has a request to read within `LINGER_S` and no other work
        waits for this thread meanwhile."""
        if conn.is_http2 or not self.alive:
            return False
        ahead = conn.parser.unreader.buf.getvalue()
        if ahead:  # read ahead: the next request is here, or its start (then the poller gathers the rest)
            return head_state(ahead) != "more"
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        waiting = getattr(self.tpool, "_work_queue", None)
        deadline = time.monotonic() + LINGER_S
        with self._linger_lock:
            self._lingering += 1
        try:
            # work queued before the count above was seen sent no wake-up: it is in the queue now
            # (the main thread queues, then reads the count), so this look closes that window
            if waiting is not None and not waiting.empty():
                return False
            while self.alive:
                for fd, _ in poller.poll(LINGER_SLICE_S * 1000):
                    if fd != self._wake_r:  # served here only when its head is whole: else the poller gathers it
                        return _whole_head_waits(conn)
                    try:
                        os.read(self._wake_r, 1)
                        return False  # this thread answers the wake-up: it gives way
                    except BlockingIOError:  # another lingering thread took that byte
                        pass
                if (waiting is not None and not waiting.empty()) or time.monotonic() >= deadline:
                    return False
            return False
        finally:
            with self._linger_lock:
                self._lingering -= 1


def _whole_head_waits(conn) -> bool:
    """Whether the bytes waiting on a readable connection hold a whole request head (peeked: the
    poller reads them when they do not)."""
    try:
        waiting = conn.sock.recv(MAX_HEAD_BYTES + PREREAD_BODY_MAX + 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True  # the thread meets the error and closes the connection
    return not waiting or head_state(waiting) != "more"  # b"": closed, which the thread sees at once


_date: tuple[int, str] = (0, "")


def _http_date(timestamp: float | None = None) -> str:
    """gunicorn's `util.http_date`, formatted once a second rather than per answer: every answer's
    `Date` of a second is the same, and `email.utils.formatdate` is ~4% of a request's CPU in a
    gthread worker (issue 20). A given timestamp is formatted as gunicorn does."""
    global _date
    if timestamp is not None:
        return _formatdate(timestamp)
    now = int(time.time())
    made = _date  # one read: another thread may replace it meanwhile, with this second's or the next's
    if made[0] != now:
        made = _date = (now, _formatdate(now))
    return made[1]


_formatdate = gunicorn_util.http_date
gunicorn_util.http_date = _http_date  # gunicorn's Response reads it as util.http_date()


class OneWorkerServer(BaseApplication):
    def __init__(
        self,
        binds: list[str],
        load: Callable[[], Any],
        close: Callable[[], None],
        *,
        threads: int = 32,
        timeout_s: int = 120,
        name: str = "faas-gpu",
    ):
        self._binds, self._load, self._close = binds, load, close
        self._threads, self._timeout, self._name = threads, timeout_s, name
        super().__init__()

    def load_config(self) -> None:
        for key, value in {
            "bind": self._binds,
            "workers": 1,
            "worker_class": LingeringThreadWorker,
            "threads": self._threads,
            "keepalive": 75,
            "timeout": self._timeout,
            "graceful_timeout": 40,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": self._name,
            "worker_exit": lambda _server, _worker: self._close(),
            "post_fork": _die_with_master,
        }.items():
            self.cfg.set(key, value)

    def load(self):
        return self._load()


MAX_JSON_BODY_BYTES = 1024 * 1024
"""The largest JSON body an internal API reads (a lease's report, a MIG geometry): far above any
a daemon sends, far below what would cost a daemon its memory."""


def parse_json_body(raw: bytes, field_name: str = "body", max_bytes: int = MAX_JSON_BODY_BYTES) -> Any:
    """JSON from a request body; ValueError naming `field_name` for anything else: too large, not
    UTF-8, not JSON, or nested too deeply (json's decoder recurses once per level: 100,000 `[`
    raised RecursionError, which `get_json(silent=True)` does not catch: a 500)."""
    if len(raw) > max_bytes:
        raise ValueError(f"{field_name}: {len(raw)} bytes; at most {max_bytes} bytes of JSON")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{field_name}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{field_name}: invalid JSON ({str(exc)[:200]})") from None


def request_json(field_name: str = "body", max_bytes: int = MAX_JSON_BODY_BYTES) -> Any:
    """The current request's JSON body (`parse_json_body`); None when it has none. The body is read
    only up to `max_bytes` + 1."""
    raw = flask_request.stream.read(max_bytes + 1) if flask_request.content_length != 0 else b""
    if not raw:
        return None
    return parse_json_body(raw, field_name, max_bytes)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not header or not header.startswith("Bearer "):
        return None
    return header[7:].strip() or None


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of bytes: `hmac.compare_digest` raises TypeError on a non-ASCII
    str (`Authorization: Bearer ä` answered 500), and a header is whatever the client sent."""
    if given is None or not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


def unauthorized(message: str = "invalid token") -> Response:
    resp = Response(message + "\n", status=401, mimetype="text/plain")
    resp.headers["WWW-Authenticate"] = 'Bearer realm="faas-gpu"'
    return resp


def _die_with_master(server, _worker) -> None:
    """The worker stops with its master, even one killed with -9: SIGTERM at once, so it
    finishes its in-flight requests (nothing lost), closes its app (model workers, replicas)
    and frees the port for the master the supervisor starts next."""
    import signal

    from faas_gpu.procs import die_with_parent

    die_with_parent(signal.SIGTERM, parent_pid=server.pid)


def require_bearer_token(
    app: Flask, token: str, prefix: str = "/v1/", checked_by_route: Callable[[], bool] | None = None
) -> None:
    """Internal APIs answer 401 without `Authorization: Bearer <token>` (compared in constant time).
    `checked_by_route()`: True for a request whose route checks its caller itself (the GPU
    Manager's job route with a placement lease), which this guard lets through."""

    @app.before_request
    def _check_token():
        if flask_request.path.startswith(prefix):
            if checked_by_route is not None and checked_by_route():
                return None
            if not token_matches(bearer_token(flask_request.headers.get("Authorization")), token):
                return unauthorized()
        return None
