"""`faas_gpu.http1` against raw-socket peers: answers framed every way RFC 9112 allows are read
whole, a peer that misbehaves gives the error callers map (never a hang, never a wrong body), and
the request's head is the one `http.client` sends. The instance's direct connections to its
GPU Manager (`faas_gpu.client._DirectConnections`) are kept alive and reopened the same way."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections.abc import Callable

import pytest

from faas_gpu.client import _DirectConnections
from faas_gpu.http1 import Connection, ProtocolError, RemoteClosed
from tests.provider.test_upstream import Replica


class Peer(Replica):
    """Answers each request on each connection with `answers(n)` bytes (None: close; a 1-tuple:
    these bytes, then close), n counting requests from 0; records the heads it read."""

    def __init__(self, answers: Callable[[int], bytes | tuple[bytes] | None], reset: bool = False):
        self.answers, self.reset = answers, reset
        super().__init__(Peer._answer_all)
        self.port = self.sock.getsockname()[1]

    def _answer_all(self, conn: socket.socket, n: int) -> None:
        while self.read(conn) is not None:
            out = self.answers(len(self.heads) - 1)
            if out is None:
                if self.reset:  # an RST instead of a FIN
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if isinstance(out, tuple):
                conn.sendall(out[0])
                conn.shutdown(socket.SHUT_WR)
                return
            conn.sendall(out)

    def connection(self, timeout: float = 5.0) -> Connection:
        return Connection("127.0.0.1", self.port, timeout)


@pytest.fixture
def peers():
    made: list[Peer] = []

    def make(answers, reset: bool = False) -> Peer:
        made.append(Peer(answers, reset))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_a_content_length_answer_is_read_whole_and_the_connection_kept(peers):
    peer = peers(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello")
    conn = peer.connection()
    for _ in range(3):
        a = conn.request("POST", "/x", {"X-B": "y"}, b"body")
        assert (a.status, a.reason, a.body, a.will_close) == (200, "OK", b"hello", False)
        assert a.headers == [("Content-Length", "5"), ("X-A", "1"), ("X-A", "2")] and a.header("x-a") == "1"
    assert peer.connections == 1 and not conn.dropped()


def test_a_chunked_answer_is_decoded_with_its_extensions_and_trailers_read_past(peers):
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nT: v\r\n\r\n"
    peer = peers(lambda n: chunked)
    conn = peer.connection()
    assert conn.request("GET", "/").body == b"hello!"
    assert conn.request("GET", "/").body == b"hello!"  # the connection is where the next answer starts
    assert peer.connections == 1


def test_interim_answers_are_read_past_and_bodiless_statuses_have_no_body(peers):
    answers = {
        0: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        1: b"HTTP/1.1 204 No Content\r\n\r\n",
        2: b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",  # HEAD: the length of a body not sent
        3: b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        4: b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz",
    }
    peer = peers(answers.get)
    conn = peer.connection()
    assert (conn.request("POST", "/", body=b"x").status, conn.request("DELETE", "/").status) == (201, 204)
    assert conn.request("HEAD", "/").body == b"" and conn.request("GET", "/").body == b""
    assert conn.request("GET", "/").body == b"z" and peer.connections == 1


def test_answers_that_end_the_connection_say_so(peers):
    peer = peers(
        {
            0: b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\na",
            1: b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb",
            2: b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nc",
        }.get
    )
    conn = peer.connection()
    assert conn.request("GET", "/").will_close
    assert conn.request("GET", "/").will_close
    assert not conn.request("GET", "/").will_close


def test_a_body_delimited_by_the_connections_end_is_read_to_it(peers):
    a = peers(lambda n: (b"HTTP/1.1 200 OK\r\n\r\nall of it",)).connection().request("GET", "/")
    assert (a.body, a.will_close) == (b"all of it", True)


def test_a_connection_closed_or_reset_before_any_answer_is_remote_closed(peers):
    for reset in (False, True):
        with pytest.raises(RemoteClosed):
            peers(lambda n: None, reset=reset).connection().request("POST", "/", body=b"x")


@pytest.mark.parametrize(
    "bad",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: value\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 101 + b"\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n",  # the head cut short
    ],
)
def test_an_answer_that_is_not_http_1_is_a_protocol_error(peers, bad):
    peer = peers(lambda n: (bad,))
    with pytest.raises(ProtocolError):
        # the peer closes after its bytes, so every cut-short case ends rather than waits
        conn = peer.connection(timeout=2.0)
        conn.send("GET", "/")
        conn.read_answer("GET")


def test_no_answer_within_the_timeout_is_a_timeout(peers):
    done = threading.Event()
    conn = peers(lambda n: done.wait(5) and None).connection(timeout=0.2)
    with pytest.raises(TimeoutError):
        conn.request("GET", "/")
    done.set()


def test_a_body_that_stops_coming_is_a_timeout_not_a_short_body(peers):
    """The timeout is the kernel's (SO_RCVTIMEO on a blocking socket, no poll before each receive):
    one that runs out mid-body must still be a timeout, never read as the connection's end."""
    conn = peers(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").connection(timeout=0.2)
    with pytest.raises(TimeoutError):
        conn.request("GET", "/")
    assert conn.sock.gettimeout() is None  # blocking: Python adds no poll of its own


def test_a_request_the_peer_does_not_take_within_the_timeout_is_a_timeout():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never reads
    try:
        conn = Connection("127.0.0.1", listener.getsockname()[1], timeout=None)
        conn.connect()
        conn.settimeout(0.2)  # a changed timeout holds for the next call (without it: no limit, a hang)
        with pytest.raises(TimeoutError):
            conn.send("POST", "/", {}, b"x" * (64 << 20))
    finally:
        listener.close()


def test_the_request_head_is_the_one_http_client_sends(peers):
    peer = peers(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    cases = [
        ("POST", "/a?b=1", {"X-Y": "z", "Content-Type": "application/json"}, b"{}"),
        ("POST", "/", {}, None),
        ("GET", "/", {"Accept-Encoding": "gzip"}, None),
        ("PUT", "/p", {"Host": "elsewhere"}, b""),
    ]
    ours, theirs = Connection("127.0.0.1", peer.port), http.client.HTTPConnection("127.0.0.1", peer.port)
    for method, target, headers, body in cases:
        ours.request(method, target, headers, body)
        theirs.request(method, target, body, headers)
        theirs.getresponse().read()
    mine, std = peer.heads[0::2], peer.heads[1::2]
    assert [sorted(h.split(b"\r\n")) for h in mine] == [sorted(h.split(b"\r\n")) for h in std]


def test_an_idle_connection_the_peer_closed_reads_as_dropped(peers):
    peer = peers(lambda n: (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",))
    conn = peer.connection()
    assert not conn.request("GET", "/").will_close  # it did not say it would close
    threading.Event().wait(0.1)
    assert conn.dropped()


def test_direct_connections_are_kept_per_manager_and_reopened_when_the_manager_closed_one(peers):
    keep = peers(lambda n: b"HTTP/1.1 200 OK\r\nX-Faas-Gpu-Unit: u0\r\nContent-Length: 2\r\n\r\nok")
    closes = peers(lambda n: (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",))
    direct = _DirectConnections()
    for _ in range(3):
        a = direct.post(f"http://127.0.0.1:{keep.port}", "/v1/jobs/d?unit=u0", b"t", {"Authorization": "Bearer x"}, 5.0)
        assert (a.status_code, a.content, a.text, a.headers["x-faas-gpu-unit"]) == (200, b"ok", "ok", "u0")
        assert direct.post(f"http://127.0.0.1:{closes.port}", "/v1/jobs/d", b"t", {}, 5.0).status_code == 200
    assert (keep.connections, closes.connections) == (1, 3)
    assert keep.heads[0].startswith(b"POST /v1/jobs/d?unit=u0 HTTP/1.1\r\n")


def test_a_direct_connection_that_fails_is_closed_and_the_failure_raised(peers):
    dead = peers(lambda n: None)
    direct = _DirectConnections()
    with pytest.raises(OSError):
        direct.post(f"http://127.0.0.1:{dead.port}", "/v1/jobs/d", b"t", {}, 5.0)
    assert direct._kept.connections() == {}
    with pytest.raises(ProtocolError):
        direct.post("https://127.0.0.1:1", "/v1/jobs/d", b"t", {}, 5.0)


def test_the_host_header_names_the_port_unless_it_is_http_s_own():
    assert [Connection(h, p)._host_header for h, p in (("a", 80), ("a", 8080), ("::1", 80), ("::1", 81))] == [
        "a",
        "a:8080",
        "[::1]",
        "[::1]:81",
    ]


def test_a_streamed_body_is_read_piece_by_piece_to_its_end(peers):
    """`read_answer(stream=True)` leaves a body without a length to `Answer.stream`: chunked, to
    the connection's end, or malformed (ProtocolError, never a wrong body); one with a length is
    read whole as ever."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n"
    conn = peers(lambda n: chunked).connection()
    conn.send("GET", "/")
    answer = conn.read_answer("GET", stream=True)
    assert answer.body == b"" and answer.stream is not None and not answer.will_close
    pieces = []
    while piece := answer.stream.read():
        pieces.append(piece)
    assert pieces == [b"hello", b"!"] and answer.stream.complete and answer.stream.read() == b""
    assert conn.request("GET", "/").body == b"hello!"  # the connection is where the next answer starts

    to_close = peers(lambda n: (b"HTTP/1.1 200 OK\r\n\r\nuntil the end",)).connection()
    to_close.send("GET", "/")
    answer = to_close.read_answer("GET", stream=True)
    assert answer.will_close and answer.stream.read() == b"until the end" and answer.stream.read() == b""

    sized = peers(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").connection()
    sized.send("GET", "/")
    assert sized.read_answer("GET", stream=True).stream is None

    bad = peers(lambda n: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",)).connection()
    bad.send("GET", "/")
    with pytest.raises(ProtocolError):
        bad.read_answer("GET", stream=True).stream.read()


def test_a_huge_chunk_is_handed_on_in_bounded_pieces_and_a_cut_one_is_an_error(peers):
    """A hostile replica announcing a chunk of a terabyte: its bytes come in pieces of at most
    the reader's size, as they arrive (nothing gathered), and the chunk cut short is a
    ProtocolError; a chunk-size line over 64 KiB or a negative size is one too."""
    huge = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000\r\n" + b"x" * 300_000
    conn = peers(lambda n: (huge,)).connection()
    conn.send("GET", "/")
    stream = conn.read_answer("GET", stream=True).stream
    got = 0
    with pytest.raises(ProtocolError, match="cut short"):
        while piece := stream.read(65536):
            assert len(piece) <= 65536
            got += len(piece)
    assert got == 300_000 and not stream.complete
    for bad_size in (b"1" * 70_000, b"-5"):
        answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + bad_size + b"\r\nhello\r\n0\r\n\r\n"
        bad = peers(lambda n, answer=answer: (answer,)).connection()
        bad.send("GET", "/")
        with pytest.raises(ProtocolError):
            bad.read_answer("GET", stream=True).stream.read()
