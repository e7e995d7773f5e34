"""inproc mode (our addition): the function served inside the watchdog's process.

http mode forks `fprocess` once and proxies each call to the function's own HTTP server: a second
server, a second parse and serialisation, and a second process's CPU per call; for a batched GPU
call that was ~1.3 ms of the instance's ~2 ms (issue 20). Here the watchdog imports the script
`fprocess` runs (`python index.py`, as a module, so it does not start a server of its own) and
calls it in the request's thread, through the first entry point the script has:
- `handle_http(method, path, query, headers, body) -> (status, [(header, value)], body)`: the
  python3-gpu template's index.py;
- `app`, a WSGI application (python3-http's Flask `app`), given an environ built from the parsed
  request.

What the watchdog does for it is what it does in http mode: its routes, `max_inflight`, the body
limit, X-Duration-Seconds, the graceful stop, the function's stdout and stderr logged (`Captured`),
and `/_/ready` 503 until the script has loaded (calls that come before wait for it, within their
timeout). Two differences, each as a user of of-watchdog would expect them: the exec timeout
answers 504 and closes the connection but cannot stop the handler's thread (http mode cannot stop
its function process either; the late result is dropped), and a script that fails to import ends
the watchdog with exit code 1, as http mode's function process exiting does. A handler that
crashes the interpreter takes the watchdog with it, which is what http mode does when its child
dies: the runtime starts the replica again.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shlex
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes

from .logs import log
from .streams import Stream, is_stream, pump

if TYPE_CHECKING:
    from .front import Handler

_PYTHON = re.compile(r"python[0-9.]*")
CallResult = tuple[int, list[tuple[str, str]], bytes | Iterable[bytes]]


def script_of(fprocess: str) -> tuple[str, list[str]]:
    """The script and its arguments in `fprocess`; SystemExit naming the variable when it is not
    `python SCRIPT.py [ARGS]` (the script runs in this interpreter, not the one named)."""
    try:
        words = shlex.split(fprocess)
    except ValueError as exc:
        raise SystemExit(f"fwatchdog: fprocess {fprocess!r} is not a command line ({exc})") from None
    if len(words) < 2 or not _PYTHON.fullmatch(os.path.basename(words[0])) or not words[1].endswith(".py"):
        raise SystemExit(
            f"fwatchdog: mode inproc runs a Python script in the watchdog's process: fprocess must be "
            f"`python SCRIPT.py`, got {fprocess!r}"
        )
    return words[1], words[2:]


class InProcess:
    """The function's script, loaded once (`load`, in a thread beside the server)."""

    def __init__(self, fprocess: str):
        self.script, self.args = script_of(fprocess)
        self.loaded = threading.Event()
        self.call = None  # (method, path, query, headers, body) -> CallResult

    def load(self) -> None:
        path = os.path.abspath(self.script)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"fprocess's script {self.script!r} is not in {os.getcwd()}")
        sys.path.insert(0, os.path.dirname(path))
        sys.argv = [path, *self.args]
        spec = importlib.util.spec_from_file_location("faas_function_main", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        if callable(getattr(module, "handle_http", None)):
            self.call = module.handle_http
        elif callable(getattr(module, "app", None)):
            self.call = WsgiCall(module.app)
        else:
            raise AttributeError(f"{self.script} has neither handle_http(...) nor a WSGI `app`")
        self.loaded.set()

    def load_or_exit(self) -> None:
        try:
            self.load()
        except BaseException:  # noqa: BLE001 — whatever stops the script: the replica is restarted
            log("Function failed to load in process:")
            for line in traceback.format_exc().rstrip().splitlines():
                log(line)
            os._exit(1)


class WsgiCall:
    """A WSGI application called with one parsed request."""

    def __init__(self, app):
        self.app = app

    def __call__(self, method, path, query, headers, body) -> CallResult:
        env = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": _unquote_latin1(path),
            "QUERY_STRING": query,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8080",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for k, v in headers.items():
            key = k.upper().replace("-", "_")
            if key == "CONTENT_TYPE":
                env[key] = v
            elif key != "CONTENT_LENGTH":
                key = "HTTP_" + key
                env[key] = f"{env[key]},{v}" if key in env else v
        got: list = []

        def start_response(status_line, response_headers, exc_info=None):
            got[:] = [int(status_line.split(" ", 1)[0]), list(response_headers)]

        chunks = self.app(env, start_response)
        if not isinstance(chunks, list | tuple):
            if not got:  # a generator calls start_response when first iterated (PEP 3333)
                chunks = _first_pulled(chunks)
            if not any(k.lower() == "content-length" for k, _ in got[1]):
                return got[0], got[1], chunks  # no length, not a list: streamed, as a WSGI server sends it
        try:
            data = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return got[0], got[1], data


class _first_pulled:  # noqa: N801 — an iterable, named for what it is
    """A WSGI iterable whose first item is read now (so that start_response has been called),
    iterated from that item; `close` is the iterable's."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.it = iter(chunks)
        self.first = [next(self.it, b"")]

    def __iter__(self):
        yield from self.first
        yield from self.it

    def close(self):
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()


def _unquote_latin1(path: str) -> str:
    """PATH_INFO as a WSGI server gives it: %-escapes decoded, bytes as latin-1 (PEP 3333)."""
    return unquote_to_bytes(path).decode("latin-1") if "%" in path else path


class _Call:
    """One call's answer, given once: by the handler's thread, or at the deadline by the timer.

    A streamed answer has begun once its head is sent (`begin_stream`); the deadline then cuts it
    (`cut`: the connection shut, the stream's thread closes the function's iterator at its next
    item) instead of answering 504."""

    __slots__ = ("h", "lock", "answered", "t0", "streaming", "cut")

    def __init__(self, h: Handler, t0: float):
        self.h, self.t0, self.lock, self.answered = h, t0, threading.Lock(), False
        self.streaming = False
        self.cut: str | None = None

    def answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> bool:
        with self.lock:
            if self.answered:
                return False
            self.answered = True
            self.h.reply(status, data, headers, content_type=self.h.wd.cfg.content_type)
            return True

    def begin_stream(self, stream: Stream, status: int, headers: list[tuple[str, str]]) -> bool:
        """The stream's head, unless the deadline answered 504 first."""
        with self.lock:
            if self.answered:
                return False
            self.answered = self.streaming = True
            stream.head(status, headers, self.h.wd.cfg.content_type)
            return True

    def time_out(self) -> None:
        h = self.h
        with self.lock:
            if self.streaming:
                took = time.monotonic() - self.t0
                self.cut = f"the exec timeout passed ({took:.3f}s)"
                try:  # the caller sees the cut now, not when the function yields its next item
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if self.answered:
                return
            self.answered = True
            took = time.monotonic() - self.t0
            try:
                h.reply(
                    504,
                    f"Timeout after {took:.3f}s waiting for the function\n".encode(),
                    [("X-Duration-Seconds", f"{took:.6f}")],
                    close=True,
                )
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_WR)  # the caller sees the end now, not when the handler returns
            except OSError:
                pass


def serve_inproc(h: Handler, body: bytes, t0: float) -> int:
    """Call the function in this thread and answer with what it returns plus X-Duration-Seconds
    (504 at the request's timeout, 503 if the script has not loaded by then); an answer whose body
    is an iterator is streamed (`streams`), within the same timeout. Returns the status."""
    wd = h.wd
    timeout = h.request_timeout()
    fn = wd.function
    if not fn.loaded.is_set() and not fn.loaded.wait(timeout or None):
        h.reply(503, b"function not loaded yet\n")
        return 503
    call = _Call(h, t0)
    ticket = wd.deadlines.add(t0 + timeout, call.time_out) if timeout else None
    path, _, query = h.path.partition("?")
    try:
        try:
            status, headers, data = fn.call(h.command, path, query, h.headers, body)
        except Exception as exc:  # noqa: BLE001 — the entry point's own failure: this call's 500
            traceback.print_exc()
            status, headers, data = 500, [], f"{type(exc).__name__}: {exc}\n".encode()
        out = [(k, v) for k, v in headers if k.lower() != "x-duration-seconds"]
        out.append(("X-Duration-Seconds", f"{time.monotonic() - t0:.6f}"))  # a stream's: to its head
        if is_stream(data):
            return _stream(h, call, status, out, data)
    finally:
        if ticket is not None:
            wd.deadlines.cancel(ticket)
    if not call.answer(status, out, data if isinstance(data, bytes) else bytes(data)):
        h.close_connection = True
        return 504
    return status


def _stream(h: Handler, call: _Call, status: int, headers: list[tuple[str, str]], items) -> int:
    stream = Stream(h)
    if not call.begin_stream(stream, status, headers):  # the deadline answered 504 first
        close = getattr(items, "close", None)
        if close is not None:
            close()
        h.close_connection = True
        return 504
    pump(h, stream, items, cut_reason=lambda: call.cut)
    with call.lock:  # ended: the deadline, if it comes before it is cancelled, finds nothing to cut
        call.streaming = False
    h.sent = stream.sent
    return status
