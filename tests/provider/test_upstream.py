"""The gateway's connections to replicas (`provider.upstream`, through `Invoker.forward`), against
raw-socket replicas that misbehave on cue: each failure maps to the outcome the gateway answered
with urllib3's pool (refused: another replica until the ready timeout, then 502; dropped: the one
resend; timeout: 504), and a kept-alive connection the replica closed is reopened unseen."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from urllib3.util import parse_url

from faas_gpu.http1 import Connection
from faas_gpu.ports import free_port
from provider.gateway import InvocationApp
from provider.invoke import Invoker, ReplicaDropped, ReplicaRefused, ReplicaTimeout
from provider.upstream import ReplicaConnections, request_target

KEY = ("fn", "openfaas-fn")


def read_request(conn: socket.socket) -> bytes | None:
    """One request's head and body, or None when the client closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head


def answer(body: bytes = b"ok", extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


class Replica:
    """A listening socket whose every accepted connection is handed to `serve(conn, n)` (n counts
    connections from 0); `heads` records each request's head as read."""

    def __init__(self, serve: Callable[[Replica, socket.socket, int], None]):
        self.serve = serve
        self.heads: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            n, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._run, args=(conn, n), daemon=True).start()

    def _run(self, conn: socket.socket, n: int) -> None:
        with conn:
            self.serve(self, conn, n)

    def read(self, conn: socket.socket) -> bytes | None:
        head = read_request(conn)
        if head is not None:
            self.heads.append(head)
        return head

    def close(self) -> None:
        self.sock.close()


def keep_alive(replica: Replica, conn: socket.socket, n: int) -> None:
    while replica.read(conn) is not None:
        conn.sendall(answer(b"ok"))


def one_answer_then_close(replica: Replica, conn: socket.socket, n: int) -> None:
    """Answers as if it kept the connection alive, then closes it while the client idles (a
    server's idle timeout, a replica restarted in place)."""
    if replica.read(conn) is not None:
        conn.sendall(answer(b"ok"))
        time.sleep(0.05)


@pytest.fixture
def replicas():
    made: list[Replica] = []

    def make(serve) -> Replica:
        made.append(Replica(serve))
        return made[-1]

    yield make
    for r in made:
        r.close()


def invoker(upstream_timeout_s: float = 5.0, ready_timeout_s: float = 0.3) -> Invoker:
    runtime = SimpleNamespace(endpoints=lambda name, namespace: [])
    return Invoker(
        None, runtime, ("openfaas-fn",), upstream_timeout_s=upstream_timeout_s, ready_timeout_s=ready_timeout_s
    )


def test_a_kept_alive_connection_is_reused(replicas):
    replica, inv = replicas(keep_alive), invoker()
    for _ in range(3):
        assert inv.forward(replica.url, "POST", "/", "", {}, b"x").body == b"ok"
    assert replica.connections == 1


def test_a_kept_alive_connection_the_replica_closed_between_calls_is_reopened_unseen(replicas):
    replica, inv = replicas(one_answer_then_close), invoker()
    for _ in range(3):
        assert inv.forward(replica.url, "POST", "/", "", {}, b"x").body == b"ok"
        time.sleep(0.2)  # the replica closes the idle connection meanwhile
    assert replica.connections == 3 and len(replica.heads) == 3


def test_a_connection_closed_under_the_call_itself_is_sent_once_more_on_a_fresh_one(replicas, monkeypatch):
    """The race the idle check cannot see: the replica closes the kept-alive connection just as
    the call goes out (here the check is made blind to it)."""

    def closes_the_first_idle_connection(replica: Replica, conn: socket.socket, n: int) -> None:
        if replica.read(conn) is not None:
            conn.sendall(answer(b"ok"))
            if n == 0:
                return  # closed before the second call's bytes are read
            keep_alive(replica, conn, n)

    replica, inv = replicas(closes_the_first_idle_connection), invoker()
    assert inv.forward(replica.url, "POST", "/", "", {}, b"x").body == b"ok"
    time.sleep(0.1)
    monkeypatch.setattr(Connection, "dropped", lambda self: False)
    assert inv.forward(replica.url, "POST", "/", "", {}, b"x").body == b"ok"
    assert replica.connections == 2

    # where the call must not be resent (a function annotated retry-on-reset "false"), it is not
    replica, inv = replicas(closes_the_first_idle_connection), invoker()
    assert inv.forward(replica.url, "POST", "/", "", {}, b"x").body == b"ok"
    time.sleep(0.1)
    with pytest.raises(ReplicaDropped):
        inv.forward(replica.url, "POST", "/", "", {}, b"x", may_resend=lambda: False)
    assert replica.connections == 1


def test_a_refused_connection_is_refused():
    with pytest.raises(ReplicaRefused):
        invoker().forward(f"http://127.0.0.1:{free_port()}", "GET", "/", "", {}, b"")


def test_a_replica_that_accepts_and_closes_without_answering_dropped_the_call(replicas):
    def drops(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)

    replica = replicas(drops)
    with pytest.raises(ReplicaDropped):
        invoker().forward(replica.url, "POST", "/", "", {}, b"x")
    assert replica.connections == 1  # a fresh connection's drop is not resent here


def test_a_replica_that_does_not_answer_in_time_timed_out(replicas):
    def silent(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        time.sleep(1.5)

    replica = replicas(silent)
    t0 = time.monotonic()
    with pytest.raises(ReplicaTimeout):
        invoker(upstream_timeout_s=5).forward(replica.url, "POST", "/", "", {}, b"x", timeout_s=0.3)
    assert time.monotonic() - t0 < 1.2


def test_an_answer_cut_short_dropped_the_call(replicas):
    def cut(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")

    with pytest.raises(ReplicaDropped):
        invoker().forward(replicas(cut).url, "POST", "/", "", {}, b"x")


def test_answers_pass_as_sent(replicas):
    """Repeated headers stay repeated, hop-by-hop ones go, a compressed body is not decompressed
    (urllib3 decoded it and left `Content-Encoding` on it), and `Connection: close` closes."""
    packed = gzip.compress(b"hello")

    def varied(replica: Replica, conn: socket.socket, n: int) -> None:
        while (head := replica.read(conn)) is not None:
            if head.startswith(b"HEAD"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n")
            elif head.startswith(b"DELETE"):
                conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            elif head.startswith(b"PUT"):
                conn.sendall(answer(b"bye", "Connection: close\r\n"))
                return
            else:
                conn.sendall(answer(packed, "Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Encoding: gzip\r\n"))

    replica, inv = replicas(varied), invoker()
    r = inv.forward(replica.url, "GET", "/", "", {}, b"")
    assert r.status == 200 and r.body == packed
    assert r.headers == [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Content-Encoding", "gzip")]
    head = inv.forward(replica.url, "HEAD", "/", "", {}, b"")
    assert (head.status, head.body, head.headers) == (200, b"", [("X-A", "1")])
    assert inv.forward(replica.url, "DELETE", "/", "", {}, b"").status == 204
    assert inv.forward(replica.url, "PUT", "/", "", {}, b"x").body == b"bye"
    assert replica.url not in inv.replicas._connections()  # closed with the answer
    assert replica.connections == 1


def test_request_headers_and_target_go_as_urllib3_sent_them(replicas):
    replica, inv = replicas(keep_alive), invoker()
    inv.forward(replica.url, "POST", "/a b/./c", "q=1 2", {"X-Y": "z", "Connection": "keep-alive", "Host": "h"}, b"")
    head = replica.heads[0].decode()
    assert head.startswith("POST /a%20b/c?q=1%202 HTTP/1.1\r\n")
    assert "X-Y: z" in head and "Content-Length: 0" in head and "Connection" not in head
    assert f"Host: {replica.url[len('http://') :]}" in head


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/", ""),
        ("", ""),
        ("/predict/v1", "a=1&b=two"),
        ("/x/../y", ""),
        ("/.well-known/x", ""),
        ("/a%2fb", "c=%7e"),
        ("/é", "ü=1"),
        ("/a#b", ""),
        ("/a?b", "c"),
        ("/a", "b#c"),
        ("/~user/:@!$&'()*+,;=", "x=/?:@"),
    ],
)
def test_the_request_target_is_urllib3s(path, query):
    url = "http://h" + (path or "/") + (f"?{query}" if query else "")
    assert request_target(path, query) == parse_url(url).request_uri


def test_a_thread_keeps_connections_to_a_bounded_number_of_replicas(replicas):
    conns = ReplicaConnections(max_per_thread=2)
    made = [replicas(keep_alive) for _ in range(3)]
    for r in made:
        assert conns.request(r.url, "GET", "/", {}, None, 5.0)[0] == 200
    assert list(conns._connections()) == [made[1].url, made[2].url]
    conns.request(made[1].url, "GET", "/", {}, None, 5.0)
    conns.request(made[0].url, "GET", "/", {}, None, 5.0)  # the least recently used goes
    assert list(conns._connections()) == [made[1].url, made[0].url]
    assert [r.connections for r in made] == [2, 1, 1]


def test_each_thread_has_its_own_connection(replicas):
    replica, inv = replicas(keep_alive), invoker()
    threads = [threading.Thread(target=inv.forward, args=(replica.url, "GET", "/", "", {}, b"")) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replica.connections == 3


# -- through the gateway's routes: the answers OpenFaaS gives ------------------------------------


def gateway(inv: Invoker, ready: list[str]) -> InvocationApp:
    """`_forward` over a real `Invoker.forward`, its replica choice round robin over `ready`."""
    app = InvocationApp.__new__(InvocationApp)
    turn = iter(range(1_000_000))
    inv.runtime = SimpleNamespace(endpoints=lambda name, namespace: ready, wait_ready=lambda *a: False)
    inv.exists = lambda key: True
    inv.pick = lambda key, headers=None: ready[next(turn) % len(ready)] if ready else None
    app.invoker = inv
    record = SimpleNamespace(deployment=SimpleNamespace(annotations={}, envVars={}))  # no max_inflight
    store = SimpleNamespace(cached=lambda name, namespace: record)
    inv.store = store  # the ready replicas' max_inflight share is read from the record
    app.provider = SimpleNamespace(store=store, scale_from_zero=lambda key: None)
    return app


def call(app: InvocationApp):
    return app._forward(KEY, "fn", "POST", "/", "", {}, b"x")


def test_through_the_gateway_refused_tries_the_others_then_answers_502(replicas):
    ok = replicas(keep_alive)
    dead = f"http://127.0.0.1:{free_port()}"
    assert call(gateway(invoker(), [dead, ok.url])).status == 200
    t0 = time.monotonic()
    r = call(gateway(invoker(ready_timeout_s=0.3), [dead]))
    assert (r.status, r.body) == (502, b"Can't reach service for: fn.\n")
    assert 0.3 <= time.monotonic() - t0 < 2


def test_through_the_gateway_a_dropped_call_is_resent_to_another_replica(replicas):
    dropper = replicas(lambda replica, conn, n: replica.read(conn))
    ok = replicas(keep_alive)
    assert call(gateway(invoker(), [dropper.url, ok.url])).status == 200
    assert dropper.connections == 1 and len(ok.heads) == 1
    r = call(gateway(invoker(), [dropper.url]))  # with no other, the same: dropped twice, 502
    assert (r.status, r.body) == (502, b"Can't reach service for: fn.\n") and dropper.connections == 3


def test_through_the_gateway_a_timeout_answers_504(replicas):
    def silent(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        time.sleep(1.0)

    r = call(gateway(invoker(upstream_timeout_s=0.2), [replicas(silent).url]))
    assert (r.status, r.body) == (504, b"Timeout reaching service for: fn.\n")


# -- a call at zero: it waits for the replica it starts, and says so (issue 46) -------------------


def at_zero(inv: Invoker, url: str, ready_after_s: float | None) -> tuple[InvocationApp, list]:
    """The gateway over a function at zero: the call's `scale_from_zero` starts a replica that is
    ready `ready_after_s` later (None: never)."""
    started: list[float] = []

    def ready() -> bool:
        return bool(started) and ready_after_s is not None and time.monotonic() - started[0] >= ready_after_s

    def wait_ready(namespace, name, timeout_s):
        deadline = time.monotonic() + timeout_s
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        return ready()

    inv.runtime = SimpleNamespace(
        endpoints=lambda name, namespace: [url] if ready() else [], wait_ready=wait_ready, problem=lambda *a: None
    )
    inv.exists = lambda key: True
    inv.pick = lambda key, headers=None: url if ready() else None
    app = InvocationApp.__new__(InvocationApp)
    app.invoker = inv
    record = SimpleNamespace(deployment=SimpleNamespace(annotations={}, envVars={}))
    inv.store = SimpleNamespace(cached=lambda namespace, name: record)  # max_inflight's share reads it
    app.provider = SimpleNamespace(
        store=inv.store,
        scale_from_zero=lambda key: started.append(time.monotonic()),
    )
    return app, started


def header(result, name):
    return next((v for k, v in result.headers if k.lower() == name.lower()), None)


def test_a_call_at_zero_waits_for_the_replica_it_starts_and_says_how_long(replicas):
    app, started = at_zero(invoker(ready_timeout_s=5.0), replicas(keep_alive).url, 0.3)
    r = call(app)
    assert r.status == 200 and len(started) == 1
    assert 0.3 <= float(header(r, "X-Faas-Gpu-Cold-Start-Seconds")) < 3


def test_a_cold_start_past_the_ready_timeout_is_a_503_that_says_so_and_how_long_it_waited(replicas):
    app, _ = at_zero(invoker(ready_timeout_s=0.4), replicas(keep_alive).url, None)
    r = call(app)
    assert r.status == 503
    assert b"No endpoints available for: fn: cold start: no replica became ready within 0." in r.body
    assert 0.4 <= float(header(r, "X-Faas-Gpu-Cold-Start-Seconds")) < 2


def test_a_timeout_after_a_cold_start_says_the_call_woke_the_function(replicas):
    def silent(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        time.sleep(1.0)

    app, _ = at_zero(invoker(upstream_timeout_s=0.2, ready_timeout_s=5.0), replicas(silent).url, 0.2)
    r = call(app)
    assert r.status == 504 and b"Timeout reaching service for: fn. (after a cold start of 0." in r.body
    assert header(r, "X-Faas-Gpu-Cold-Start-Seconds") is not None


# -- streamed answers (issue 43) -----------------------------------------------------------
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%X\r\n%b\r\n" % (len(data), data)


def test_a_streamed_answer_comes_back_at_its_head_and_each_piece_as_it_arrives(replicas):
    """A chunked answer is handed on at its head with `stream=True`; each chunk as it comes (the
    second is sent only once the first was read); read to its end, the connection is kept."""
    first_read = threading.Event()

    def streaming(replica: Replica, conn: socket.socket, n: int) -> None:
        while replica.read(conn) is not None:
            conn.sendall(CHUNKED_HEAD + _chunk(b"data: 1\n\n"))
            first_read.wait(10)
            conn.sendall(_chunk(b"data: 2\n\n") + b"0\r\n\r\n")

    replica = replicas(streaming)
    inv = invoker()
    result = inv.forward(replica.url, "GET", "/", "", {}, b"", stream=True)
    assert result.status == 200 and result.body == b"" and result.stream is not None
    assert ("Content-Type", "text/event-stream") in result.headers
    assert not any(k.lower() == "transfer-encoding" for k, _ in result.headers)  # hop-by-hop: the gateway frames it
    pieces = iter(result.stream)
    assert next(pieces) == b"data: 1\n\n"
    first_read.set()
    assert list(pieces) == [b"data: 2\n\n"]
    result.stream.close()
    assert result.stream.whole
    first_read.clear()
    again = inv.forward(replica.url, "GET", "/", "", {}, b"", stream=True)
    first_read.set()
    assert again.stream.whole_body() == b"data: 1\n\ndata: 2\n\n" and replica.connections == 1


def test_a_whole_answer_is_read_whole_even_when_a_stream_is_allowed(replicas):
    result = invoker().forward(replicas(keep_alive).url, "POST", "/", "", {}, b"x", stream=True)
    assert (result.status, result.body, result.stream) == (200, b"ok", None)


def test_a_stream_cut_short_reaches_the_caller_as_a_reset_and_closes_the_connection(replicas):
    """The replica dies mid-stream: the WSGI server gets a connection reset to close the caller's
    connection without the last chunk (StreamCut); the call is not retried here (it had begun)."""
    from provider.streaming import StreamCut

    def cut(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        conn.sendall(CHUNKED_HEAD + _chunk(b"partial") + b"10\r\nhal")

    replica = replicas(cut)
    result = invoker().forward(replica.url, "GET", "/", "", {}, b"", stream=True)
    got = []
    with pytest.raises(StreamCut) as cut_exc:
        for piece in result.stream:
            got.append(piece)
    assert b"".join(got).startswith(b"partial") and isinstance(cut_exc.value.__cause__, ReplicaDropped)
    result.stream.close()
    assert not result.stream.whole and replica.connections == 1


def test_a_stream_that_runs_past_the_calls_timeout_is_cut(replicas):
    """The call's timeout bounds the whole stream, not each piece: a replica that keeps sending
    slowly is cut once it has passed."""
    from provider.streaming import StreamCut

    def slow(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        conn.sendall(CHUNKED_HEAD)
        try:
            for _ in range(100):
                conn.sendall(_chunk(b"."))
                time.sleep(0.1)
        except OSError:
            pass

    result = invoker(upstream_timeout_s=0.6).forward(replicas(slow).url, "GET", "/", "", {}, b"", stream=True)
    with pytest.raises(StreamCut) as cut_exc:
        for _ in result.stream:
            pass
    assert isinstance(cut_exc.value.__cause__, ReplicaTimeout)
    result.stream.close()


def test_closing_a_stream_early_closes_the_replicas_connection_and_finishes_the_call(replicas):
    """A caller gone mid-stream: the WSGI server closes the iterable, which closes the connection
    (how the replica's watchdog learns it) and runs the call's bookkeeping once, as not whole."""
    saw_close = threading.Event()

    def endless(replica: Replica, conn: socket.socket, n: int) -> None:
        replica.read(conn)
        conn.sendall(CHUNKED_HEAD + _chunk(b"first"))
        if conn.recv(1) == b"":
            saw_close.set()

    result = invoker().forward(replicas(endless).url, "GET", "/", "", {}, b"", stream=True)
    ended: list[bool] = []
    result.stream.at_end(ended.append)
    assert next(iter(result.stream)) == b"first"
    result.stream.close()
    result.stream.close()
    assert saw_close.wait(5) and ended == [False]
