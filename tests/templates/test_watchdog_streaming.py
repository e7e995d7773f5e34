"""Streamed answers through the watchdog alone (templates/python3-gpu, issue 43): a handler whose
answer's body is a generator is answered chunk by chunk as it yields, in process (inproc) and
through index.py's own server (http mode), over real HTTP.

The handler's generators wait on files the test makes (`X-Gate`), and say they were closed by
writing one (`X-Mark`), so a test knows what the handler is doing without timing it."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path

import pytest

from tests.templates.test_watchdog import Watchdog, function_dir, inproc_env, serve_env, watchdogs

__all__ = ["function_dir", "serve_env", "watchdogs"]  # fixtures, shared with the watchdog's own tests

STREAMING = """
import os, time


def _wait_for(path, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def _closed(mark):
    with open(mark, "w") as f:
        f.write("closed")


def handle(event, context):
    kind = event.path.strip("/")
    gate, mark = event.headers.get("X-Gate"), event.headers.get("X-Mark")
    if kind == "gated":
        def tokens():
            try:
                yield "data: first\\n\\n"
                _wait_for(gate)  # the test reads the first chunk, then lets the handler go on
                yield b"data: second\\n\\n"
                yield ""  # nothing to send: skipped, never a chunk that would end the answer
                yield "data: \\u00e9\\n\\n"
            finally:
                _closed(mark)
        return {"statusCode": 202, "body": tokens(),
                "headers": {"Content-Type": "text/event-stream", "X-Kind": "gated"}}
    if kind == "forever":
        def tokens():
            try:
                n = 0
                while True:
                    yield f"{n}\\n"
                    n += 1
                    time.sleep(0.05)
            finally:
                _closed(mark)
        return {"body": tokens()}
    if kind == "flood":
        def pieces():
            try:
                while True:
                    yield b"x" * 1048576
            finally:
                _closed(mark)
        return {"body": pieces()}
    if kind == "stuck":
        def tokens():
            try:
                yield "first"
                time.sleep(60)  # a model that hangs mid-stream: no next item to cut at
                yield "never"
            finally:
                _closed(mark)
        return {"body": tokens()}
    if kind == "raise":
        def tokens():
            yield "partial"
            raise RuntimeError("the model fell over")
        return {"body": tokens()}
    if kind == "wrong-type":
        def tokens():
            yield "partial"
            yield {"not": "text"}
        return {"body": tokens()}
    if kind == "raise-first":
        def tokens():
            raise RuntimeError("no tokens at all")
            yield "never"
        return {"body": tokens()}
    if kind == "wrong-type-first":
        return {"body": iter([42])}
    if kind == "bare":
        return (w for w in ("a", "b"))
    if kind == "empty":
        return {"body": iter([]), "headers": {"X-Empty": "1"}}
    return {"body": "whole"}
"""


@pytest.fixture
def streaming_dir(function_dir):
    (function_dir / "function" / "handler.py").write_text(STREAMING)
    return function_dir


def _conn(wd: Watchdog) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", wd.port, timeout=30)


def _wait_for(path: Path, wd: Watchdog, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared\n{wd.output()}"
        time.sleep(0.02)


def test_a_generator_body_is_sent_chunk_by_chunk_as_the_handler_yields(watchdogs, streaming_dir, serve_env, tmp_path):
    """The first chunk arrives while the handler is still blocked before its second (it waits for
    a file only the test makes after reading the first): with the handler's status and headers,
    chunked, no Content-Length; str as UTF-8, bytes as they are, an empty item skipped; the
    connection serves the next call afterwards."""
    wd = watchdogs(serve_env(), cwd=streaming_dir)
    gate, mark = tmp_path / "gate", tmp_path / "mark"
    conn = _conn(wd)
    conn.request("GET", "/gated", headers={"X-Gate": str(gate), "X-Mark": str(mark)})
    r = conn.getresponse()
    assert (r.status, r.getheader("Content-Type"), r.getheader("X-Kind")) == (202, "text/event-stream", "gated")
    assert r.getheader("Transfer-Encoding") == "chunked" and r.getheader("Content-Length") is None
    assert r.read1(65536) == b"data: first\n\n"
    assert not mark.exists()  # the handler has not finished: it waits for the gate
    gate.touch()
    assert r.read() == "data: second\n\ndata: é\n\n".encode()
    _wait_for(mark, wd)
    conn.request("GET", "/whole")  # the same connection: the stream ended with its last chunk
    again = conn.getresponse()
    assert again.read() == b"whole" and again.getheader("Content-Length") == "5"
    conn.close()


def test_a_caller_that_goes_away_has_the_generator_closed(watchdogs, streaming_dir, serve_env, tmp_path):
    """A token generator must stop when nobody reads it any more: the caller closes its connection
    mid-stream and the generator's `finally` runs (GeneratorExit at its yield)."""
    wd = watchdogs(serve_env(), cwd=streaming_dir)
    mark = tmp_path / "mark"
    conn = _conn(wd)
    conn.request("GET", "/forever", headers={"X-Mark": str(mark)})
    r = conn.getresponse()
    assert r.read1(65536).startswith(b"0\n")
    conn.close()
    r.close()
    _wait_for(mark, wd)
    if serve_env is inproc_env:
        assert "Client went away after" in wd.output()


@pytest.mark.parametrize("kind, logged", [("raise", "RuntimeError: the model fell over"), ("wrong-type", "is dict")])
def test_a_stream_that_fails_mid_way_is_cut_without_its_last_chunk(watchdogs, streaming_dir, serve_env, kind, logged):
    """An exception, or an item that is neither str nor bytes, after the first chunk: the answer
    (200 already sent) ends without its last chunk, so the caller sees it incomplete, not short;
    the watchdog logs the cut and why."""
    wd = watchdogs(serve_env(), cwd=streaming_dir)
    conn = _conn(wd)
    conn.request("GET", f"/{kind}")
    r = conn.getresponse()
    assert r.status == 200 and r.read1(65536) == b"partial"
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    conn.close()
    deadline = time.monotonic() + 10
    while "Stream cut after 7 bytes" not in wd.output():
        assert time.monotonic() < deadline, wd.output()
        time.sleep(0.05)
    assert logged in wd.output()


@pytest.mark.parametrize(
    "kind, message",
    [("raise-first", "RuntimeError: no tokens at all"), ("wrong-type-first", "item 0 of the streamed body is int")],
)
def test_a_failure_before_the_first_item_is_a_plain_500(watchdogs, streaming_dir, serve_env, kind, message):
    """Nothing has been sent yet: the caller gets the handler's error as any other (500 and why)."""
    wd = watchdogs(serve_env(), cwd=streaming_dir)
    conn = _conn(wd)
    conn.request("GET", f"/{kind}")
    r = conn.getresponse()
    body = r.read().decode()
    assert r.status == 500 and message in body and r.getheader("Content-Length") == str(len(body.encode()))
    conn.close()


def test_the_exec_timeout_cuts_a_stream_and_closes_its_generator(watchdogs, streaming_dir, serve_env, tmp_path):
    """exec_timeout bounds the whole stream: past it the answer is cut (no last chunk) and the
    generator closed; the watchdog serves on."""
    wd = watchdogs(serve_env(exec_timeout="1s"), cwd=streaming_dir)
    mark = tmp_path / "mark"
    conn = _conn(wd)
    conn.request("GET", "/forever", headers={"X-Mark": str(mark)})
    r = conn.getresponse()
    assert r.status == 200
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    conn.close()
    _wait_for(mark, wd)
    assert "Stream cut after" in wd.output() and "exec timeout passed" in wd.output()
    conn = _conn(wd)
    conn.request("GET", "/whole")
    assert conn.getresponse().read() == b"whole"
    conn.close()


def test_a_caller_that_never_reads_a_flood_is_cut_at_the_exec_timeout(watchdogs, streaming_dir, serve_env, tmp_path):
    """A caller that sends a call and reads nothing of an answer of 1 MiB pieces without end (its
    window shut): the write blocked on it fails at exec_timeout, the stream is cut, the generator
    closed, and the watchdog serves on; nothing waits for the caller."""
    wd = watchdogs(serve_env(exec_timeout="1s"), cwd=streaming_dir)
    mark = tmp_path / "mark"
    caller = socket.socket()
    caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    caller.connect(("127.0.0.1", wd.port))
    try:
        caller.sendall(f"GET /flood HTTP/1.1\r\nHost: x\r\nX-Mark: {mark}\r\n\r\n".encode())
        _wait_for(mark, wd)
        conn = _conn(wd)
        conn.request("GET", "/whole")
        assert conn.getresponse().read() == b"whole"
        conn.close()
    finally:
        caller.close()


def test_a_generator_that_hangs_mid_stream_is_cut_at_the_exec_timeout_not_at_its_next_item(
    watchdogs, streaming_dir, serve_env, tmp_path
):
    """The generator hangs after its first item (it would yield again a minute later): at
    exec_timeout the caller's answer ends cut, without waiting for an item to cut at."""
    wd = watchdogs(serve_env(exec_timeout="1s"), cwd=streaming_dir)
    conn = http.client.HTTPConnection("127.0.0.1", wd.port, timeout=30)  # well under the hang
    conn.request("GET", "/stuck", headers={"X-Mark": str(tmp_path / "mark")})
    r = conn.getresponse()
    assert r.status == 200 and r.read1(65536) == b"first"
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    conn.close()


def test_a_generator_returned_bare_and_an_empty_stream(watchdogs, streaming_dir, serve_env):
    """A handler may return the generator itself (Flask streams what a view returns); a stream
    with no item is an empty chunked answer, with its headers."""
    wd = watchdogs(serve_env(), cwd=streaming_dir)
    conn = _conn(wd)
    conn.request("GET", "/bare")
    r = conn.getresponse()
    assert (r.status, r.getheader("Content-Type"), r.read()) == (200, "text/html; charset=utf-8", b"ab")
    conn.request("GET", "/empty")
    r = conn.getresponse()
    assert r.getheader("X-Empty") == "1" and r.getheader("Transfer-Encoding") == "chunked" and r.read() == b""
    conn.close()


def test_an_http_1_0_caller_gets_the_stream_until_the_connection_ends(watchdogs, streaming_dir, tmp_path):
    """No chunked framing for a caller that cannot read it: the bytes as they come, then the end."""
    import socket

    wd = watchdogs(inproc_env(), cwd=streaming_dir)
    gate, mark = tmp_path / "gate", tmp_path / "mark"
    gate.touch()
    with socket.create_connection(("127.0.0.1", wd.port), timeout=30) as sock:
        sock.sendall(f"GET /gated HTTP/1.0\r\nX-Gate: {gate}\r\nX-Mark: {mark}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Content-Length" not in head
    assert body == "data: first\n\ndata: second\n\ndata: é\n\n".encode()


def test_whole_answers_keep_their_length(watchdogs, streaming_dir):
    """Only an iterator body streams: a str body is still one answer with a Content-Length, in
    both modes (checked in process here; test_watchdog compares every shape across the modes)."""
    wd = watchdogs(inproc_env(), cwd=streaming_dir)
    conn = _conn(wd)
    conn.request("GET", "/whole")
    r = conn.getresponse()
    assert r.read() == b"whole" and r.getheader("Content-Length") == "5" and r.getheader("Transfer-Encoding") is None
    conn.close()


def test_a_head_request_gets_the_head_and_the_generator_is_closed(watchdogs, streaming_dir, tmp_path):
    """HEAD: the stream's status and headers, no body, and the generator closed, not run on."""
    wd = watchdogs(inproc_env(), cwd=streaming_dir)
    gate, mark = tmp_path / "gate", tmp_path / "mark"
    conn = _conn(wd)
    conn.request("HEAD", "/gated", headers={"X-Gate": str(gate), "X-Mark": str(mark)})
    r = conn.getresponse()
    assert (r.status, r.getheader("X-Kind"), r.read()) == (202, "gated", b"")
    _wait_for(mark, wd)  # closed at its first yield: it never waited for the gate
    conn.request("GET", "/whole")
    assert conn.getresponse().read() == b"whole"
    conn.close()
