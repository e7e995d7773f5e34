"""`/async-function` against a real stack process: callbacks reach no internal address (issue
41, finding 1), a bad callback URL is a 400 (finding 6), a silent callback target holds up no
other caller (finding 5), and a call is run and called back once whatever the caller resends
(issue 42). Real etcd and Redis (tests.servers), real HTTP receivers on loopback."""

from __future__ import annotations

import base64
import json
import socket
import threading

import pytest
import redis
import requests

from faas_gpu.datastore import open_datastore
from tests.provider.async_stack import NS, deploy, invocations, receiving
from tests.stack_process import StackProcess
from tests.waiting import eventually


# -- callbacks into the stack itself (issue 41, finding 1) ---------------------------------------------
@pytest.fixture(scope="module")
def closed_stack(tmp_path_factory, etcd_server, redis_server):
    """A stack on etcd, Redis and a scheduler (a receiver standing in for one: it counts what
    reaches it) with the default policy: no callback to loopback."""
    with receiving() as scheduler:
        s = StackProcess(
            tmp_path_factory.mktemp("closed"),
            "--etcd",
            etcd_server.url,
            "--redis",
            redis_server.url,
            "--scheduler",
            scheduler.url.removesuffix("/cb"),
        )
        s.start()
        s.scheduler = scheduler
        try:
            deploy(s, "echo")
            yield s
        finally:
            s.stop()


def test_an_anonymous_callback_into_etcd_redis_the_scheduler_or_the_gateway_does_nothing(
    closed_stack, etcd_server, redis_server
):
    """The attack: `echo` returns the caller's body, so a callback to etcd's JSON API posts a
    forged function record there (which the provider would then launch: a shell as root). Now
    the callbacks are refused (and logged); the invocations themselves still run."""
    s = closed_stack
    key = f"/faas-gpu/functions/{NS}/pwned"
    record = {
        "deployment": {"service": "pwned", "image": "x", "envProcess": "sh -c 'id > /tmp/pwned; cat'"},
        "namespace": NS,
        "replicas": 0,
        "createdAt": "2024-01-01T00:00:00Z",
    }
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    put = {"key": b64(key.encode()), "value": b64(json.dumps(record).encode())}
    redis_port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    attacks = [
        (f"http://127.0.0.1:{etcd_server.port}/v3/kv/put", json.dumps(put).encode(), "application/json"),
        (f"http://127.0.0.1:{redis_port}/", b"SET faas-gpu:pwned 1\r\n", "text/plain"),
        (f"http://127.0.0.1:{s.gateway_port}/function/echo", b"again", "text/plain"),
        (f"http://[::ffff:127.0.0.1]:{etcd_server.port}/v3/kv/put", json.dumps(put).encode(), "application/json"),
        (f"{s.scheduler.url.removesuffix('/cb')}/v1/jobs/x", b"job", "application/octet-stream"),
    ]
    before = invocations(s, "echo")
    for url, body, content_type in attacks:
        r = requests.post(
            f"{s.url}/async-function/echo",
            data=body,
            headers={"X-Callback-Url": url, "Content-Type": content_type},
            timeout=10,
        )
        assert r.status_code == 202, r.text
    assert eventually(lambda: invocations(s, "echo") >= before + len(attacks), timeout_s=60), s.log_tail()
    eventually(lambda: s.log_tail(100_000).count("callback refused") >= len(attacks), timeout_s=15)
    store = open_datastore(etcd_server.url)
    try:
        assert store.get(key) is None, "a callback wrote a function record into etcd"
    finally:
        store.close()
    assert redis.Redis.from_url(redis_server.url).get("faas-gpu:pwned") is None
    assert invocations(s, "echo") == before + len(attacks), "a callback invoked the gateway's own function"
    assert requests.get(f"{s.url}/function/pwned", timeout=10).status_code == 404
    assert not s.scheduler.seen, "a callback reached the scheduler"
    log = s.log_tail(100_000)
    assert log.count("callback refused") == len(attacks), log[-3000:]
    assert "the stack's own datastore, queue or scheduler" in log


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://[::1]:99999/",
        "http://example.com:port/",
        "gopher://127.0.0.1:6379/_x",
        "http://trusted.example@127.0.0.1/",
        "http://example.com/" + "a" * 5000,
        "http://0x7f.1/",
    ],
)
def test_a_bad_callback_url_is_a_400_naming_the_header_never_a_500(closed_stack, url):
    r = requests.post(f"{closed_stack.url}/async-function/echo", data=b"x", headers={"X-Callback-Url": url}, timeout=10)
    assert r.status_code == 400 and r.text.startswith("X-Callback-Url: "), (r.status_code, r.text)


# -- a silent callback target (issue 41, finding 5); once per call id (issue 42) ------------------------
@pytest.fixture(scope="module")
def open_stack(tmp_path_factory):
    """A stack whose callbacks may reach receivers on loopback (--callback-allow), briefly timed out."""
    s = StackProcess(
        tmp_path_factory.mktemp("open"), "--callback-allow", "127.0.0.1", "--callback-timeout", "20s"
    ).start()
    try:
        deploy(s, "echo")
        yield s
    finally:
        s.stop()


class _Silent:
    """A callback target that accepts connections and never answers (reads, counts)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.timeout(240)
def test_forty_calls_to_a_silent_callback_hold_up_no_other_callers_calls(open_stack, receiver):
    """Before, four workers each waited 30 s on the silent target: the other caller's callback
    came after all forty (~5 minutes). Now it comes while they still wait their turn."""
    s = open_stack
    silent = _Silent()
    try:
        for i in range(40):
            r = requests.post(
                f"{s.url}/async-function/echo",
                data=b"%d" % i,
                headers={"X-Callback-Url": f"http://127.0.0.1:{silent.port}/cb"},
                timeout=10,
            )
            assert r.status_code == 202
        other = requests.post(
            f"{s.url}/async-function/echo", data=b"other", headers={"X-Callback-Url": receiver.url}, timeout=10
        )
        assert other.status_code == 202
        assert eventually(lambda: receiver.seen[other.headers["X-Call-Id"]] == 1, timeout_s=120), s.log_tail()
        assert silent.accepted < 40, "the other caller's callback waited for every silent one"
    finally:
        silent.close()


def test_the_same_call_id_is_run_and_called_back_once(open_stack, receiver):
    """A caller that resends (it lost the 202, or retries a 503 with the call id it was given)."""
    s = open_stack
    before = invocations(s, "echo")
    headers = {"X-Callback-Url": receiver.url, "X-Call-Id": "resent-call-1"}
    for _ in range(3):
        r = requests.post(f"{s.url}/async-function/echo", data=b"once", headers=headers, timeout=10)
        assert r.status_code == 202 and r.headers["X-Call-Id"] == "resent-call-1"
    assert eventually(lambda: receiver.seen["resent-call-1"] >= 1, timeout_s=60)
    r = requests.post(f"{s.url}/async-function/echo", data=b"once", headers=headers, timeout=10)  # after it ran
    assert r.status_code == 202
    other = requests.post(
        f"{s.url}/async-function/echo", data=b"x", headers={"X-Callback-Url": receiver.url}, timeout=10
    )
    assert eventually(lambda: receiver.seen[other.headers["X-Call-Id"]] == 1, timeout_s=60)  # the queue moved on
    assert receiver.seen["resent-call-1"] == 1
    assert invocations(s, "echo") == before + 2
