"""`faas_gpu.serving.LingeringThreadWorker`: a request thread serves the next request of its
kept-alive connection, and gives the thread up when another connection needs it."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from faas_gpu.ports import free_port

SERVER = textwrap.dedent(
    """
    import sys
    from faas_gpu import serving
    from faas_gpu.serving import OneWorkerServer

    serving.LINGER_S, serving.LINGER_SLICE_S = float(sys.argv[3]), float(sys.argv[4])

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/partial":  # reads 10 bytes of the body: gunicorn drains the rest
            body = environ["wsgi.input"].read(10)
        else:
            body = environ["wsgi.input"].read() or b"ok"
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    OneWorkerServer([f"127.0.0.1:{sys.argv[1]}"], lambda: app, lambda: None, threads=int(sys.argv[2])).run()
    """
)


@pytest.fixture
def server():
    def start(threads: int, linger_s: float = 0.2, slice_s: float = 0.025) -> int:
        port = free_port()
        argv = [str(port), str(threads), str(linger_s), str(slice_s)]
        proc = subprocess.Popen([sys.executable, "-c", SERVER, *argv])
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    procs: list[subprocess.Popen] = []
    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=30)


def _call(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes, str | None]:
    conn.request("POST", "/x", body=body)
    r = conn.getresponse()
    return r.status, r.read(), r.getheader("Connection")


def test_kept_alive_connection_answers_each_request(server):
    port = server(4)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(20):
        assert _call(conn, b"call %d" % i)[:2] == (200, b"call %d" % i)
        if i % 5 == 4:
            time.sleep(0.3)  # past the linger: the connection went back to gunicorn's poller
    conn.close()


def test_lingering_thread_gives_way_to_another_connection(server):
    """One thread lingering a minute on an idle connection, looking around only every 5 s: a
    second connection is served before its client's 3 s timeout (the main thread's wake-up makes
    the lingering thread give way at once), and then the first again."""
    port = server(1, linger_s=60.0, slice_s=5.0)
    first = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert _call(first, b"a")[:2] == (200, b"a")
    for i in range(3):  # each time the one thread lingers on the other connection
        second = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        assert _call(second, b"b%d" % i)[:2] == (200, b"b%d" % i)  # not after a slice (5 s) nor the linger
        assert _call(first, b"c%d" % i)[:2] == (200, b"c%d" % i)  # the first connection is still served
        second.close()
    first.close()


def test_pipelined_requests_on_one_connection(server):
    port = server(2)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        one = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\none"
        s.sendall(one + one.replace(b"one", b"two"))
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"two"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    assert data.index(b"one") < data.index(b"two")


def test_a_body_the_app_left_unread_is_drained_before_the_next_request(server):
    """A body read to its end is not drained again (no time-bounded drain); one the app left
    unread still is, so the next request on the connection starts where it should."""
    port = server(2)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(3):
        conn.request("POST", "/partial", body=b"%d" % i + b"x" * 2_000)
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, (b"%d" % i + b"x" * 9))
        assert _call(conn, b"whole %d" % i)[:2] == (200, b"whole %d" % i)
    conn.close()


def test_the_date_header_is_gunicorns_formatted_once_a_second():
    import email.utils

    from gunicorn import util

    from faas_gpu import serving

    assert util.http_date is serving._http_date  # what gunicorn's answers call
    now = time.time()
    assert util.http_date(now) == email.utils.formatdate(now, usegmt=True)
    for _ in range(3):
        before = int(time.time())
        got = util.http_date()
        after = int(time.time())
        if before == after:  # not across a second's turn
            assert got == email.utils.formatdate(before, usegmt=True)
            break
    else:
        pytest.fail("three seconds' turns in a row")
