"""Streamed answers through the whole stack (issue 43): a python3-gpu function built into a real
stack's image store, whose handler's body is a generator, called through the gateway's port and
the provider's `/function/*`, over real HTTP.

The handler and the test talk through a small HTTP server of the test's on loopback (a replica
sees no file of the test's: it runs in a mount namespace of its own): the handler asks it to go
on (`/wait/<call>`, answered once the test has read the first chunk) and tells it what happened
(`/ran/<call>`, `/closed/<call>` from its generator's `finally`)."""

from __future__ import annotations

import collections
import http.client
import re
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from faas_gpu.build import build
from faas_gpu.imagestore import ImageStore
from faas_gpu.stack import load_stack
from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow

NAME = "streamer"
ONE = "streamer-one"
"""The same image deployed with OpenFaaS's `max_inflight: "1"`: one call in flight at a time."""
CALL_TIMEOUT_S = 10
"""The gateway's upstream_timeout in these tests: a stream's whole time, its writes to the caller included."""
HANDLER = """\
import os
import time
import urllib.request


def _tell(base, what, call):
    urllib.request.urlopen(f"{base}/{what}/{call}", timeout=60).read()


def handle(event, context):
    kind = event.path.strip("/")
    base, call = event.headers.get("X-Test-Server"), event.headers.get("X-Test-Call", "")
    if kind == "gated":
        def tokens():
            try:
                _tell(base, "ran", call)
                yield "data: first\\n\\n"
                _tell(base, "wait", call)  # answered once the test has read the first chunk
                yield "data: second\\n\\n"
            finally:
                _tell(base, "closed", call)
        return {"statusCode": 201, "body": tokens(), "headers": {"Content-Type": "text/event-stream", "X-Kind": "sse"}}
    if kind == "forever":
        def tokens():
            try:
                n = 0
                while True:
                    yield f"{n}\\n"
                    n += 1
                    time.sleep(0.05)
            finally:
                _tell(base, "closed", call)
        return {"body": tokens()}
    if kind == "flood":
        def pieces():
            try:
                _tell(base, "ran", call)
                while True:
                    yield b"x" * 262144
            finally:
                _tell(base, "closed", call)
        return {"body": pieces()}
    if kind == "cut":
        def tokens():
            _tell(base, "ran", call)
            yield "partial"
            raise RuntimeError("the model fell over")
        return {"body": tokens()}
    if kind == "words":
        return {"body": (w for w in ("one ", "two ", "three")), "headers": {"Content-Type": "text/plain"}}
    return "whole"
"""
STACK = (
    "version: 1.0\nprovider: {name: openfaas}\nfunctions:\n  NAME: {lang: python3-gpu, handler: ./fn, image: NAME}\n"
)


class HandlerTalk:
    """What the handler tells (`seen[(what, call)]`), and the gates it waits on (`release`)."""

    def __init__(self):
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()
        self.gates: dict[str, threading.Event] = collections.defaultdict(threading.Event)
        self.callbacks: list[tuple[dict[str, str], bytes]] = []
        test = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                _, what, call = self.path.split("/", 2)
                if what == "wait":
                    test.gates[call].wait(60)
                test.seen[(what, call)] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):  # noqa: N802 — an async call's callback
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                test.callbacks.append((dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def headers(self, call: str) -> dict[str, str]:
        return {"X-Test-Server": self.url, "X-Test-Call": call}

    def until(self, what: str, call: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.seen[(what, call)]:
            assert time.monotonic() < deadline, f"the handler never said {what} for {call}: {dict(self.seen)}"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def tests_server():
    s = HandlerTalk()
    yield s
    s.server.shutdown()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("streaming") / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("upstream_timeout", f"{CALL_TIMEOUT_S}s")
        s = StackProcess(home, "--callback-allow", "127.0.0.1").start()
    project = home.parent / "project"
    (project / "fn").mkdir(parents=True)
    (project / "fn" / "handler.py").write_text(HANDLER)
    (project / "stack.yml").write_text(STACK.replace("NAME", NAME))
    build(load_stack(project / "stack.yml").functions[NAME], ImageStore(home / "images"), stack_dir=project)
    r = s.request("POST", "/system/functions", json={"service": NAME, "image": f"{NAME}:latest"}, timeout=30)
    assert r.status_code == 202, r.text
    one = {"service": ONE, "image": f"{NAME}:latest", "envVars": {"max_inflight": "1"}}
    r = s.request("POST", "/system/functions", json=one, timeout=30)
    assert r.status_code == 202, r.text
    s.wait_ready(NAME, timeout_s=120)
    s.wait_ready(ONE, timeout_s=120)
    yield s
    s.stop()


def _conn(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=60)


@pytest.mark.parametrize("port", ["url", "provider_url"])
def test_an_event_stream_reaches_the_caller_chunk_by_chunk_as_the_handler_yields(stack, tests_server, port):
    """The first event arrives while the handler is blocked before its second (it waits on the
    test, which lets it go only after reading the first): nothing gathered on the way, through
    the gateway's port and the provider's `/function/*` alike; the handler's status and headers
    first, chunked, no Content-Length; then the connection serves the next call."""
    call = uuid.uuid4().hex
    conn = _conn(getattr(stack, port))
    conn.request("GET", f"/function/{NAME}/gated", headers=tests_server.headers(call))
    r = conn.getresponse()
    assert (r.status, r.getheader("Content-Type"), r.getheader("X-Kind")) == (201, "text/event-stream", "sse")
    assert r.getheader("Transfer-Encoding") == "chunked" and r.getheader("Content-Length") is None
    assert r.getheader("X-Call-Id")
    assert r.read1(65536) == b"data: first\n\n"
    assert not tests_server.seen[("closed", call)]  # the handler is still running
    tests_server.gates[call].set()
    assert r.read() == b"data: second\n\n"
    tests_server.until("closed", call)
    conn.request("GET", f"/function/{NAME}/whole")
    assert conn.getresponse().read() == b"whole"
    conn.close()


def test_a_streamed_calls_duration_is_counted_when_it_ends(stack, tests_server):
    """gateway_functions_seconds counts a stream when its last chunk has gone, not at its head:
    held open here for a second at least, its duration is at least that."""
    call = uuid.uuid4().hex
    before = _seconds_sum(stack)
    conn = _conn(stack.url)
    conn.request("GET", f"/function/{NAME}/gated", headers=tests_server.headers(call))
    r = conn.getresponse()
    assert r.read1(65536) == b"data: first\n\n"
    time.sleep(1.0)
    tests_server.gates[call].set()
    assert r.read() == b"data: second\n\n"
    conn.close()
    deadline = time.monotonic() + 10
    while _seconds_sum(stack) - before < 1.0:
        assert time.monotonic() < deadline, (before, _seconds_sum(stack))
        time.sleep(0.05)


def _seconds_sum(stack: StackProcess) -> float:
    text = requests.get(f"{stack.url}/metrics", timeout=10).text
    pattern = rf'gateway_functions_seconds_sum\{{code="201",function_name="{NAME}\.openfaas-fn"\}} (\S+)'
    return sum(float(v) for v in re.findall(pattern, text))


@pytest.mark.parametrize("port", ["url", "provider_url"])
def test_a_caller_that_goes_away_stops_the_generator_through_the_gateway(stack, tests_server, port):
    """The caller closes its connection mid-stream: the gateway closes its connection to the
    replica, whose watchdog closes the handler's generator (its `finally` runs)."""
    call = uuid.uuid4().hex
    conn = _conn(getattr(stack, port))
    conn.request("GET", f"/function/{NAME}/forever", headers=tests_server.headers(call))
    r = conn.getresponse()
    assert r.status == 200 and r.read1(65536).startswith(b"0\n")
    conn.close()
    r.close()
    tests_server.until("closed", call)


def test_a_stream_cut_mid_way_reaches_the_caller_cut_and_is_never_resent(stack, tests_server):
    """The handler fails after its first chunk: the caller's answer ends without its last chunk
    (incomplete, not short), and the call ran once: an answer that has begun is never resent."""
    call = uuid.uuid4().hex
    conn = _conn(stack.url)
    conn.request("POST", f"/function/{NAME}/cut", body=b"x", headers=tests_server.headers(call))
    r = conn.getresponse()
    assert r.status == 200 and r.read1(65536) == b"partial"
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    conn.close()
    time.sleep(0.5)  # a resend, were there one, would have run by now
    assert tests_server.seen[("ran", call)] == 1
    assert requests.get(f"{stack.url}/function/{NAME}/whole", timeout=30).text == "whole"


def test_an_async_call_posts_the_whole_streamed_body_to_its_callback(stack, tests_server):
    r = requests.post(
        f"{stack.url}/async-function/{NAME}/words",
        data=b"",
        headers={"X-Callback-Url": f"{tests_server.url}/cb"},
        timeout=30,
    )
    assert r.status_code == 202
    deadline = time.monotonic() + 30
    while not tests_server.callbacks:
        assert time.monotonic() < deadline, "no callback"
        time.sleep(0.05)
    headers, body = tests_server.callbacks[-1]
    assert body == b"one two three" and headers["X-Function-Status"] == "200"
    assert headers["Content-Length"] == str(len(body)) and "Transfer-Encoding" not in headers


def _status_becomes(stack: StackProcess, status: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := requests.get(f"{stack.url}/function/{ONE}/whole", timeout=30).status_code) != status:
        assert time.monotonic() < deadline, f"/function/{ONE} still answers {got}, not {status}"
        time.sleep(0.2)


def test_a_stream_holds_its_in_flight_slot_until_it_ends(stack, tests_server):
    """With max_inflight 1, a second call is refused (429) while a stream is open, and gets in
    once the stream has ended: the slot is the stream's until its last chunk, not its head."""
    call = uuid.uuid4().hex
    conn = _conn(stack.url)
    conn.request("GET", f"/function/{ONE}/gated", headers=tests_server.headers(call))
    r = conn.getresponse()
    assert r.read1(65536) == b"data: first\n\n"
    assert requests.get(f"{stack.url}/function/{ONE}/whole", timeout=30).status_code == 429
    tests_server.gates[call].set()
    assert r.read() == b"data: second\n\n"
    conn.close()
    _status_becomes(stack, 200, timeout_s=10)


def test_a_caller_that_stops_reading_loses_its_stream_at_the_calls_timeout(stack, tests_server):
    """A caller that sends a call and never reads its streamed answer (its connection open, its
    window shut) holds the gateway's write to it; at the call's timeout that write fails, the
    connection is dropped, the in-flight slot is freed and the function's generator closed.
    Before, the gateway's thread and the slot were held for as long as the caller kept still."""
    call = uuid.uuid4().hex
    host, port = stack.url.removeprefix("http://").split(":")
    caller = socket.socket()
    caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    caller.connect((host, int(port)))
    try:
        head = f"GET /function/{ONE}/flood HTTP/1.1\r\nHost: {host}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in tests_server.headers(call).items())
        caller.sendall(head.encode() + b"\r\n")
        tests_server.until("ran", call)
        assert requests.get(f"{stack.url}/function/{ONE}/whole", timeout=30).status_code == 429
        _status_becomes(stack, 200, timeout_s=CALL_TIMEOUT_S + 30)
        tests_server.until("closed", call)
    finally:
        caller.close()


def test_a_head_call_to_a_streaming_function_gets_the_head_and_its_generator_is_closed(stack, tests_server):
    """HEAD through the gateway: the function's status and headers, no body, and its generator
    closed at its first item (read before the head, as for any stream), never run on to the next
    (which would wait for the test's gate, never opened here); the connection serves on."""
    call = uuid.uuid4().hex
    conn = _conn(stack.url)
    conn.request("HEAD", f"/function/{NAME}/gated", headers=tests_server.headers(call))
    r = conn.getresponse()
    assert (r.status, r.getheader("X-Kind"), r.read()) == (201, "sse", b"")
    conn.request("GET", f"/function/{NAME}/whole")
    assert conn.getresponse().read() == b"whole"
    conn.close()
    tests_server.until("closed", call)
    assert not tests_server.seen[("wait", call)]
