"""Async callbacks (`provider.callbacks`): the URL a caller gives, where a callback may go, how one
is sent to a hostile target, and how many are sent fairly. Real sockets on loopback throughout:
servers that answer, never answer, trickle, send without end or redirect."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from provider.callbacks import (
    Callback,
    CallbackDispatcher,
    CallbackPolicy,
    Outcome,
    deliver,
    parse_allow,
    parse_callback_url,
    stack_policy,
)

# -- the URL ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "http://[::1",  # issue 41 finding 6: a 500 before
        "http://[::1]:99999/",
        "http://example.com:http/",
        "http://example.com:-1/",
        "http://example.com:0/",
        "ftp://example.com/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_SET%20a%201",
        "dict://127.0.0.1:2379/",
        "javascript:alert(1)",
        "http://user@127.0.0.1/",
        "http://trusted.example@127.0.0.1/",
        "http://:pw@example.com/",
        "http:///just-a-path",
        "http://",
        "//example.com/cb",
        "cb",
        "http://exa mple.com/",
        "http://example.com/\r\nX-Injected: 1",
        "http://example.com/\x00",
        "http://\u4f8b\u3048.jp/",
        "http:\\\\127.0.0.1\\cb",
        "http://127.0.0.1\\@example.com/",
        "http://127.1/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0x7f.0.0.1/",
        "http://0177.0.0.1/",
        "http://example.123/",
        "http://[fe80::1%25eth0]/",
        "http://[not-v6]/",
        "http://-bad.example/",
        "http://exa..mple.com/",
        "http://" + "a" * 64 + ".example/",
        "http://example.com/" + "a" * 3000,
        "",
    ],
)
def test_unparsable_callback_urls_are_refused_naming_the_header(raw):
    with pytest.raises(ValueError) as err:
        parse_callback_url(raw)
    assert str(err.value).startswith("X-Callback-Url: ")


def test_plain_callback_urls_parse_to_what_is_connected_to():
    u = parse_callback_url("http://Example.COM/cb?x=1#frag")
    assert (u.scheme, u.host, u.port, u.target, u.key, u.host_header) == (
        "http",
        "example.com",
        80,
        "/cb?x=1",
        "example.com:80",
        "example.com",
    )
    u = parse_callback_url("HTTPS://hooks.example.:8443")
    assert (u.scheme, u.host, u.port, u.target) == ("https", "hooks.example", 8443, "/")
    assert u.host_header == "hooks.example:8443"
    u = parse_callback_url("http://[2001:db8::1]:8080/x")
    assert (u.host, u.key, u.host_header, u.ip) == (
        "2001:db8::1",
        "[2001:db8::1]:8080",
        "[2001:db8::1]:8080",
        ipaddress.ip_address("2001:db8::1"),
    )
    assert parse_callback_url("http://10.0.0.1/").ip == ipaddress.ip_address("10.0.0.1")  # the policy decides


# -- where a callback may go -------------------------------------------------------------------------
URL = parse_callback_url("http://cb.example/")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "0.0.0.0",
        "::",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254",  # a cloud's metadata service
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "100.64.0.1",  # CGNAT
        "100.127.255.254",
        "224.0.0.1",
        "239.1.1.1",
        "ff02::1",
        "ff0e::1",
        "255.255.255.255",
        "240.0.0.1",
        "198.18.0.1",
        "192.0.0.8",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",  # IPv4-compatible
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a00:1",
        "64:ff9b:1::808:808",  # local-use NAT64: not the well-known prefix
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:c0a8:101::1",
    ],
)
def test_loopback_private_link_local_and_their_disguises_are_refused(address):
    assert CallbackPolicy().refusal(URL, [ipaddress.ip_address(address)]) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808"])
def test_public_addresses_are_allowed(address):
    assert CallbackPolicy().refusal(URL, [ipaddress.ip_address(address)]) is None


def test_one_forbidden_address_among_a_names_addresses_refuses_it():
    ips = [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("127.0.0.1")]
    assert "loopback" in CallbackPolicy().refusal(URL, ips)
    assert CallbackPolicy().refusal(URL, []) is not None


def _policy(*allow: str, **kw) -> CallbackPolicy:
    names, networks = parse_allow(allow)
    return CallbackPolicy(names, networks, **kw)


def _refused(policy: CallbackPolicy, url: str, *addresses: str) -> bool:
    return policy.refusal(parse_callback_url(url), [ipaddress.ip_address(a) for a in addresses]) is not None


def test_the_allow_list_opens_ips_cidrs_and_names_and_nothing_else():
    p = _policy("127.0.0.1")
    assert not _refused(p, "http://127.0.0.1:9/", "127.0.0.1")
    assert not _refused(p, "http://cb.example/", "::ffff:127.0.0.1")
    assert _refused(p, "http://127.0.0.2/", "127.0.0.2")
    assert _refused(p, "http://[::1]/", "::1")
    p = _policy("10.0.0.0/8,fd00::/8", "192.168.7.7")
    assert not _refused(p, "http://cb.example/", "10.9.9.9", "fd00::5")
    assert not _refused(p, "http://cb.example/", "192.168.7.7")
    assert _refused(p, "http://cb.example/", "10.9.9.9", "192.168.0.1")
    p = _policy("receiver.internal")
    assert not _refused(p, "http://Receiver.Internal/", "10.0.0.5")
    assert _refused(p, "http://other.internal/", "10.0.0.5")


@pytest.mark.parametrize("entry", ["not a host", "10.0.0.0/33", "http://x/", "a..b", "127.1"])
def test_a_bad_allow_entry_is_refused_naming_the_option(entry):
    with pytest.raises(ValueError, match="--callback-allow"):
        parse_allow([entry])


def test_the_stacks_own_addresses_are_refused_and_its_servers_stay_closed_even_when_allowed():
    own = dict(
        binds=["127.0.0.1"],
        etcd_url="http://127.0.0.1:2379,http://localhost:2380",
        redis_url="redis://127.0.0.1:6379/0",
        scheduler_url="http://127.0.0.1:8091,http://127.0.0.1:8092",
    )
    allowed = stack_policy(["127.0.0.1", "::1"], **own)
    for port in (2379, 6379, 8091, 8092):
        assert _refused(allowed, f"http://127.0.0.1:{port}/v3/kv/put", "127.0.0.1")
        assert _refused(allowed, f"http://cb.example:{port}/", "::ffff:127.0.0.1")
    assert _refused(allowed, "http://localhost:2380/", "127.0.0.1")  # the etcd host's name, by its name
    wide = stack_policy(["127.0.0.0/8", "::1"], **own)  # a server on loopback may listen on all of it
    assert _refused(wide, "http://127.0.0.2:2379/", "127.0.0.2")
    assert _refused(wide, "http://[::1]:6379/", "::1")
    assert not _refused(allowed, "http://127.0.0.1:9999/", "127.0.0.1")
    assert _refused(stack_policy([], **own), "http://127.0.0.1:9999/", "127.0.0.1")
    assert _refused(stack_policy([], binds=["8.8.8.8"]), "http://cb.example/", "8.8.8.8")  # where it listens
    everywhere = stack_policy(["10.0.0.0/8"], binds=["0.0.0.0"])
    assert _refused(everywhere, "http://cb.example/", "127.0.0.1")


def test_servers_named_by_name_are_closed_at_the_addresses_the_name_has_now():
    """A compose file's `etcd` may not resolve when the gateway starts: it is resolved again."""
    names, networks = parse_allow(["10.0.0.0/8"])
    policy = CallbackPolicy(names, networks, own_names=frozenset({"etcd"}), servers=(("etcd", 2379),))
    assert not _refused(policy, "http://cb.example:2379/", "10.0.0.3")  # not resolved yet: the name alone
    assert _refused(policy, "http://etcd:2379/", "10.0.0.3")
    now = policy.resolved(lambda host: {ipaddress.ip_address("10.0.0.3")} if host == "etcd" else set())
    assert _refused(now, "http://cb.example:2379/v3/kv/put", "10.0.0.3")
    assert not _refused(now, "http://cb.example:8080/", "10.0.0.4")


# -- one delivery, against real sockets -----------------------------------------------------------------
class _Server:
    """A TCP server on 127.0.0.1 that hands each connection to `handle` on a thread of its own."""

    def __init__(self, handle: Callable[[socket.socket, _Server], None], context: ssl.SSLContext | None = None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handle, self.context = handle, context
        self.accepted = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.sent = 0
        self.names: list[str | None] = []
        self.conns: list[socket.socket] = []
        self.got = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            self.handle(conn, self)
        except OSError:
            pass

    def read_request(self, conn: socket.socket) -> tuple[str, dict[str, str], bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        while len(body) < int(headers.get("Content-Length", 0)):
            body += conn.recv(65536)
        request = (lines[0], headers, body)
        with self.lock:
            self.requests.append(request)
        self.got.set()
        return request

    def close(self) -> None:
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()


def _answers(status: str = "200 OK", extra: str = "") -> Callable[[socket.socket, _Server], None]:
    def handle(conn: socket.socket, server: _Server) -> None:
        server.read_request(conn)
        conn.sendall(f"HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\n\r\n".encode())
        conn.close()

    return handle


def _silent(conn: socket.socket, server: _Server) -> None:
    """Accepts and never answers (reads, so a sender is never blocked on a full window)."""
    while conn.recv(65536):
        pass


def _trickles(conn: socket.socket, server: _Server) -> None:
    """Answers a byte at a time, never finishing its status line."""
    server.read_request(conn)
    while True:
        conn.sendall(b"H")
        time.sleep(0.1)


def _endless(conn: socket.socket, server: _Server) -> None:
    """A status line, then a body that never ends."""
    server.read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
    chunk = b"\0" * 65536
    while True:
        conn.sendall(chunk)
        server.sent += len(chunk)


@pytest.fixture
def servers():
    made: list[_Server] = []

    def make(handle, context=None) -> _Server:
        made.append(_Server(handle, context))
        return made[-1]

    yield make
    for s in made:
        s.close()


LOOPBACK = _policy("127.0.0.1")


def test_a_callback_is_posted_once_with_its_headers_and_body(servers):
    sink = servers(_answers())
    url = parse_callback_url(f"http://127.0.0.1:{sink.port}/cb?q=1")
    headers = {"X-Call-Id": "c1", "Content-Type": "application/json", "Transfer-Encoding": "chunked", "Bad": "a\r\nb"}
    outcome = deliver(url, b'{"ok": 1}', headers, LOOPBACK)
    assert outcome == Outcome("delivered", status=200)
    line, got, body = sink.requests[0]
    assert line == "POST /cb?q=1 HTTP/1.1" and body == b'{"ok": 1}'
    assert got["Host"] == f"127.0.0.1:{sink.port}" and got["X-Call-Id"] == "c1"
    assert got["Content-Type"] == "application/json" and "Transfer-Encoding" not in got and "Bad" not in got
    assert sink.accepted == 1


def test_a_refused_callback_never_connects(servers):
    target = servers(_answers())
    outcome = deliver(parse_callback_url(f"http://127.0.0.1:{target.port}/"), b"x", {}, CallbackPolicy())
    assert outcome.result == "refused" and "loopback" in outcome.detail
    outcome = deliver(parse_callback_url(f"http://localhost:{target.port}/"), b"x", {}, CallbackPolicy())
    assert outcome.result == "refused"
    time.sleep(0.2)
    assert target.accepted == 0


def test_a_name_is_resolved_once_and_the_checked_address_is_the_one_connected_to(servers):
    """DNS rebinding: a resolver whose second answer differs is never asked twice."""
    sink = servers(_answers())
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"] if len(asked) == 1 else ["169.254.169.254"]

    url = parse_callback_url(f"http://hooks.rebind.test:{sink.port}/cb")
    assert deliver(url, b"x", {}, LOOPBACK, resolver=rebinding) == Outcome("delivered", status=200)
    assert asked == ["hooks.rebind.test"]
    assert sink.requests[0][1]["Host"] == f"hooks.rebind.test:{sink.port}"


def test_a_name_with_one_forbidden_address_is_not_sent_to_any(servers):
    sink = servers(_answers())
    url = parse_callback_url(f"http://mixed.test:{sink.port}/")
    outcome = deliver(url, b"x", {}, LOOPBACK, resolver=lambda host, port: ["127.0.0.1", "10.0.0.1"])
    assert outcome.result == "refused" and "10.0.0.1" in outcome.detail
    assert sink.accepted == 0


def test_a_name_server_that_never_answers_costs_a_delivery_its_time_and_no_more():
    release = threading.Event()

    def stuck(host: str, port: int) -> list[str]:
        release.wait(30)
        return ["127.0.0.1"]

    try:
        url = parse_callback_url("http://slow.dns.test/")
        outcome = deliver(url, b"x", {}, LOOPBACK, resolver=stuck, connect_timeout_s=0.5, timeout_s=2)
    finally:
        release.set()
    assert outcome.result == "failed" and outcome.detail.startswith("cannot resolve slow.dns.test: no answer")


def test_redirects_are_not_followed(servers):
    inner = servers(_answers())
    outer = servers(_answers("302 Found", f"Location: http://127.0.0.1:{inner.port}/v3/kv/put\r\n"))
    outcome = deliver(parse_callback_url(f"http://127.0.0.1:{outer.port}/"), b"x", {}, LOOPBACK)
    assert outcome == Outcome("delivered", status=302)
    time.sleep(0.2)
    assert inner.accepted == 0


@pytest.mark.timeout(60)
def test_an_endless_answer_is_not_read(servers):
    endless = servers(_endless)
    outcome = deliver(parse_callback_url(f"http://127.0.0.1:{endless.port}/"), b"x", {}, LOOPBACK, timeout_s=30)
    assert outcome == Outcome("delivered", status=200)
    time.sleep(0.3)
    assert endless.sent < 64 * 1024 * 1024, "the answer's body was read"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handle", [_trickles, _silent], ids=["trickle", "silent"])
def test_a_trickling_or_silent_target_times_out(servers, handle):
    slow = servers(handle)
    url = parse_callback_url(f"http://127.0.0.1:{slow.port}/")
    outcome = deliver(url, b"x", {}, LOOPBACK, timeout_s=1)
    assert outcome == Outcome("failed", detail="no answer within 1s")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A CA of our own and a certificate from it for `hooks.tls.test`."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=test CA", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr",
             "-subj", "/CN=hooks.tls.test", cwd=d)  # fmt: skip
    (d / "ext").write_text("subjectAltName=DNS:hooks.tls.test\n")
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "leaf.pem", "-days", "2", "-extfile", "ext", cwd=d)  # fmt: skip
    return d


def test_https_keeps_the_name_for_sni_and_the_certificate_check(servers, tls_files):
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls_files / "leaf.pem", tls_files / "leaf.key")
    names: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: names.append(name)
    sink = servers(_answers(), server_ctx)
    client_ctx = ssl.create_default_context(cafile=str(tls_files / "ca.pem"))
    at_loopback = lambda host, port: ["127.0.0.1"]  # noqa: E731
    url = parse_callback_url(f"https://hooks.tls.test:{sink.port}/cb")
    outcome = deliver(url, b"tls", {}, LOOPBACK, resolver=at_loopback, ssl_context=client_ctx)
    assert outcome == Outcome("delivered", status=200)
    assert names == ["hooks.tls.test"] and sink.requests[0][2] == b"tls"
    # the same server under another name: its certificate does not match, nothing is sent
    other = parse_callback_url(f"https://other.tls.test:{sink.port}/cb")
    outcome = deliver(other, b"tls", {}, LOOPBACK, resolver=at_loopback, ssl_context=client_ctx)
    assert outcome.result == "failed" and "certificate" in outcome.detail.lower()
    assert len(sink.requests) == 1


# -- many deliveries ------------------------------------------------------------------------------------------
def _callback(url: str, label: str, outcomes: dict[str, Outcome], body: bytes = b"x") -> Callback:
    return Callback(parse_callback_url(url), body, {}, lambda o: outcomes.__setitem__(label, o), label=label)


@pytest.mark.timeout(120)
def test_a_target_that_never_answers_holds_up_no_other_targets_callbacks(servers):
    """Issue 41 finding 5: 40 callbacks to a target that accepts and never answers, then another
    caller's: it is delivered while the silent target's are still waiting their turn."""
    silent, sink = servers(_silent), servers(_answers())
    outcomes: dict[str, Outcome] = {}
    d = CallbackDispatcher(LOOPBACK, threads=4, per_target=2, timeout_s=60).start()
    try:
        for i in range(40):
            d.submit(_callback(f"http://127.0.0.1:{silent.port}/", f"silent-{i}", outcomes))
        d.submit(_callback(f"http://127.0.0.1:{sink.port}/", "other", outcomes))
        assert sink.got.wait(30)
        time.sleep(0.3)
        assert silent.accepted == 2, "at most per_target deliveries to one target at once"
        assert not any(k.startswith("silent") for k in outcomes), "the silent target's calls ended meanwhile"
    finally:
        silent.close()
        d.stop()


def test_targets_take_turns(servers):
    a, b = servers(_answers()), servers(_answers())
    order: list[str] = []
    d = CallbackDispatcher(LOOPBACK, threads=1, per_target=1)
    for label, port in [("a0", a.port), ("a1", a.port), ("a2", a.port), ("a3", a.port), ("b0", b.port), ("b1", b.port)]:
        url = parse_callback_url(f"http://127.0.0.1:{port}/")
        d.submit(Callback(url, b"x", {}, lambda o, n=label: order.append(n)))
    d.start()
    try:
        deadline = time.monotonic() + 30
        while len(order) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        d.stop()
    assert order == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_a_full_backlog_drops_its_oldest_and_says_so(caplog):
    outcomes: dict[str, Outcome] = {}
    d = CallbackDispatcher(LOOPBACK, backlog_per_target=3)  # not started: everything stays queued
    for i in range(10):
        d.submit(_callback("http://127.0.0.1:9/", str(i), outcomes))
    assert sorted(outcomes, key=int) == [str(i) for i in range(7)]
    assert all(o.result == "dropped" for o in outcomes.values())
    assert d.pending() == 3
    assert "backlog is full" in caplog.text


def test_queued_bodies_are_bounded_in_bytes():
    outcomes: dict[str, Outcome] = {}
    d = CallbackDispatcher(LOOPBACK, max_bytes=1000)
    for i in range(3):
        d.submit(_callback("http://127.0.0.1:9/", f"a{i}", outcomes, b"a" * 300))
    d.submit(_callback("http://127.0.0.1:10/", "b0", outcomes, b"b" * 300))
    assert list(outcomes) == ["a0"]  # the longest backlog's oldest
    assert d.pending() == 3
