"""Slow clients cannot hold a daemon's request threads (`faas_gpu.slow_clients`, issue 41's
slowloris finding): heads are gathered by the poller, a head has a deadline and a size limit,
one client's waiting heads are bounded, a request thread's blocked I/O times out. Each test runs
a real `OneWorkerServer` (the gunicorn worker every daemon serves with) with few threads, so
that on a server where a slow client held a thread the other callers would not be answered."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from faas_gpu import slow_clients
from faas_gpu.ports import free_port

SERVER = textwrap.dedent(
    """
    import sys
    from faas_gpu import slow_clients
    from faas_gpu.serving import OneWorkerServer

    slow_clients.HEADER_TIMEOUT_S = float(sys.argv[3])
    slow_clients.IO_TIMEOUT_S = float(sys.argv[4])
    slow_clients.MAX_HEADS_PER_CLIENT = int(sys.argv[5])

    def app(environ, start_response):
        body = environ["wsgi.input"].read() or environ["PATH_INFO"].encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    OneWorkerServer([f"127.0.0.1:{sys.argv[1]}"], lambda: app, lambda: None, threads=int(sys.argv[2])).run()
    """
)

ANSWER_S = 5.0
"""How long a test waits for an answer that a server without the guard would never give while
its threads are held (the bound of a functional check, not a timing claim)."""


@pytest.fixture
def server():
    procs: list[subprocess.Popen] = []

    def start(threads: int = 2, header_timeout_s: float = 10.0, io_timeout_s: float = 60.0, per_client: int = 64):
        port = free_port()
        argv = [str(port), str(threads), str(header_timeout_s), str(io_timeout_s), str(per_client)]
        procs.append(subprocess.Popen([sys.executable, "-c", SERVER, *argv]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


def _get(port: int, path: str = "/healthz") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_S)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _slow(port: int, first: bytes = b"GET / HTTP/1.1\r\nHost: x\r\n") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(first)
    return s


def _answer(s: socket.socket, timeout_s: float = ANSWER_S) -> bytes:
    s.settimeout(timeout_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return data


def _until(s: socket.socket, end: bytes) -> bool:
    """Reads a kept-alive connection until what arrived ends with `end` (or `ANSWER_S` passes)."""
    s.settimeout(ANSWER_S)
    data = b""
    while not data.endswith(end):
        chunk = s.recv(65536)
        if not chunk:
            return False
        data += chunk
    return True


def test_two_hundred_slowloris_connections_leave_other_callers_answered(server):
    """The attack of the finding, with 200 connections: each trickles a header line, and one the
    server closed (beyond its bound for one client) is opened again, as an attacker would."""
    port = server(threads=2)
    lorises = [_slow(port) for _ in range(200)]
    try:
        for _ in range(3):
            for i, s in enumerate(lorises):
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    s.close()
                    lorises[i] = _slow(port)
            assert _get(port) == (200, b"/healthz")
    finally:
        for s in lorises:
            s.close()


def test_a_head_trickled_on_a_kept_alive_connection_holds_no_thread(server):
    port = server(threads=1)
    kept = _slow(port, b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
    kept.settimeout(ANSWER_S)
    assert _until(kept, b"\r\n\r\n/first")
    kept.sendall(b"GET /second HTTP/1.1\r\nHost: x\r\n")  # the next request's head, cut short
    assert _get(port) == (200, b"/healthz")  # the one thread is free meanwhile
    kept.sendall(b"\r\n")
    assert _until(kept, b"\r\n\r\n/second")
    kept.close()


def test_a_small_body_trickled_holds_no_thread_and_arrives_whole(server):
    port = server(threads=1)
    s = _slow(port, b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello")
    assert _get(port) == (200, b"/healthz")
    s.sendall(b"world")
    assert _answer(s, 2.0).endswith(b"\r\n\r\nhelloworld")
    s.close()


def test_a_head_not_whole_within_its_deadline_is_answered_408_and_closed(server):
    port = server(header_timeout_s=0.5)
    s = _slow(port)
    answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    s.close()


def test_a_head_over_the_limit_is_answered_431(server):
    port = server()
    s = _slow(port, b"GET / HTTP/1.1\r\n" + b"X-a: " + b"b" * (slow_clients.MAX_HEAD_BYTES + 10))
    assert _answer(s).startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    s.close()


def test_one_clients_oldest_waiting_heads_are_closed_beyond_its_bound(server):
    port = server(per_client=4)
    first = [_slow(port) for _ in range(2)]
    time.sleep(0.2)  # the poller accepts them in order
    later = [_slow(port) for _ in range(4)]
    for s in first:
        assert _answer(s).startswith(b"HTTP/1.1 408")
    assert _get(port) == (200, b"/healthz")  # a whole head is never the one closed
    for s in later[1:]:  # the bound kept the newest waiting
        s.sendall(b"\r\n")
        assert _answer(s, 2.0).startswith(b"HTTP/1.1 200 OK")
    for s in first + later:
        s.close()


def test_a_request_thread_stalled_on_a_large_body_gives_up(server):
    port = server(threads=1, io_timeout_s=0.5)
    big = slow_clients.PREREAD_BODY_MAX + 1
    s = _slow(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\nabc" % big)
    time.sleep(1.0)  # the thread reading the body times out; the one thread is free again
    assert _get(port) == (200, b"/healthz")
    s.close()


def test_expect_100_continue_is_answered_before_its_body(server):
    port = server()
    s = _slow(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert _until(s, b"HTTP/1.1 100 Continue\r\n\r\n")
    s.sendall(b"ok")
    assert _answer(s, 2.0).endswith(b"\r\n\r\nok")
    s.close()


@pytest.mark.parametrize(
    "data, state",
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n", "more"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "ready"),
        (b"GET / HTTP/1.1\nHost: x\n\n", "ready"),
        (b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nab", "more"),
        (b"POST / HTTP/1.1\r\ncontent-length:4\r\n\r\nabcd", "ready"),
        (b"POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", "ready"),  # gunicorn's 400
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "ready"),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", "ready"),  # not ours to read
        (b"X" * (slow_clients.MAX_HEAD_BYTES + 1), "too_large"),
    ],
)
def test_head_state_of_what_has_arrived(data, state):
    assert slow_clients.head_state(data) == state
