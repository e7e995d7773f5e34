"""Functions, replica counts and accepted async work survive a restart of the provider."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from faas_gpu.credentials import TOKEN_FILE
from tests.stack_process import StackProcess


def _deploy(s: StackProcess, name: str, **extra) -> None:
    body = {"service": name, "image": "x", "envProcess": "cat", **extra}
    assert requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10).status_code == 202


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "crash"])
def test_functions_and_replicas_survive_restart(tmp_path, sig):
    s = StackProcess(tmp_path / "home").start()
    _deploy(s, "keeper", labels={"com.openfaas.scale.max": "5"})
    s.wait_ready("keeper")
    r = requests.post(f"{s.url}/system/scale-function/keeper", json={"replicas": 2}, auth=s.auth, timeout=5)
    assert r.status_code == 202
    s.wait_ready("keeper", replicas=2)
    s.stop(sig)
    s.start()
    try:
        status = s.wait_ready("keeper", replicas=2)
        assert status["replicas"] == 2
        assert requests.post(f"{s.url}/function/keeper", data=b"back", timeout=10).content == b"back"
    finally:
        s.stop()


class _Sink(BaseHTTPRequestHandler):
    bodies: list[bytes] = []
    got = threading.Event()

    def do_POST(self):  # noqa: N802
        type(self).bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        type(self).got.set()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("queue", ["embedded", "redis"])
def test_async_work_accepted_before_a_crash_is_done_after_restart(tmp_path, request, queue):
    """Accepted work is queued durably; a provider killed mid-way finishes it after restart."""
    _Sink.bodies.clear()
    _Sink.got.clear()
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    extra = request.getfixturevalue("redis_server").daemon_args() if queue == "redis" else []
    s = StackProcess(tmp_path / "home", "--callback-allow", "127.0.0.1", *extra).start()
    try:
        _deploy(s, "slow", envProcess="sh -c 'sleep 3; cat'")
        s.wait_ready("slow")
        cb = f"http://127.0.0.1:{sink.server_port}/"
        r = requests.post(f"{s.url}/async-function/slow", data=b"survive", headers={"X-Callback-Url": cb}, timeout=5)
        assert r.status_code == 202
        s.stop(signal.SIGKILL)  # the invocation is in flight or queued: never acked
        assert not _Sink.got.is_set()
        s.start()
        assert _Sink.got.wait(60), (s.home / "stack-test.log").read_text()[-3000:]
        assert _Sink.bodies == [b"survive"]
    finally:
        s.stop()
        sink.shutdown()


def test_stack_runs_on_etcd(tmp_path, etcd_server):
    s = StackProcess(tmp_path / "home", *etcd_server.daemon_args()).start()
    try:
        _deploy(s, "on-etcd")
        s.wait_ready("on-etcd")
        assert requests.post(f"{s.url}/function/on-etcd", data=b"e", timeout=10).content == b"e"
    finally:
        s.stop()
    # another provider process of the same cluster (its cluster token: records are sealed with it)
    (tmp_path / "home2" / "secrets").mkdir(parents=True)
    shutil.copy(tmp_path / "home" / "secrets" / TOKEN_FILE, tmp_path / "home2" / "secrets" / TOKEN_FILE)
    s2 = StackProcess(tmp_path / "home2", *etcd_server.daemon_args()).start()
    try:  # on the same etcd sees the function
        assert s2.wait_ready("on-etcd")["name"] == "on-etcd"
    finally:
        s2.stop()


def test_stack_rides_out_etcd_and_redis_restarts(tmp_path, etcd_server, redis_server):
    """Peers restart under the stack: it keeps serving and accepting work afterwards."""
    s = StackProcess(tmp_path / "home", *etcd_server.daemon_args(), *redis_server.daemon_args()).start()
    try:
        _deploy(s, "peer-restart")
        s.wait_ready("peer-restart")
        etcd_server.restart()
        redis_server.restart()
        assert requests.post(f"{s.url}/function/peer-restart", data=b"still", timeout=10).content == b"still"
        # writes reach the restarted etcd; until the stack's client has reconnected, a deploy is
        # answered 503 "retry later" (nothing half-written), so it is sent again as a client would
        body = {"service": "after-restart", "image": "x", "envProcess": "cat"}
        deadline = time.monotonic() + 20
        while (r := requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10)).status_code == 503:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        assert r.status_code == 202, r.text
        assert s.wait_ready("after-restart")["name"] == "after-restart"
        r = requests.post(f"{s.url}/async-function/peer-restart", data=b"q", timeout=10)
        assert r.status_code == 202  # the queue reconnected to the restarted redis
    finally:
        s.stop()
