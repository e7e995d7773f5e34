"""The first wall: etcd and Redis as the test fixtures run them (and as every set-up faas-gpu
documents runs them) take no write from anyone without the daemons' login. Issue 41's attack put a
function record into etcd through its HTTP gateway (`POST /v3/kv/put`) from a callback the stack
was made to send; here the same request, and a plain client, go straight to the servers."""

from __future__ import annotations

import base64
import time

import pytest
import redis
import requests

from faas_gpu.async_queue import RedisStreamQueue
from faas_gpu.credentials import Login, read_login
from faas_gpu.datastore import DatastoreDenied, open_datastore
from faas_gpu.datastore.etcd import EtcdDatastore

KEY = "/faas-gpu/functions/openfaas-fn/forged"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_an_anonymous_client_cannot_write_to_etcd_by_grpc_or_its_http_gateway(etcd_server):
    anonymous = open_datastore(etcd_server.address, retry_s=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(DatastoreDenied, match="wants a login"):
            anonymous.put(KEY, '{"deployment": {"envProcess": "sh"}}')
        assert time.monotonic() - t0 < 5  # refused at once, not retried as an outage
        with pytest.raises(DatastoreDenied):
            anonymous.get(KEY)
    finally:
        anonymous.close()
    body = {"key": _b64(KEY), "value": _b64('{"deployment": {"envProcess": "sh -c id"}}')}
    r = requests.post(f"{etcd_server.address}/v3/kv/put", json=body, timeout=10)
    assert r.status_code != 200 and "user name is empty" in r.text, r.text
    root = open_datastore(etcd_server.root_url)
    try:
        assert root.get(KEY) is None  # nothing was written
    finally:
        root.close()


def test_etcd_refuses_a_wrong_password_at_once_and_never_names_the_password(etcd_server):
    wrong = Login("faas-gpu", "not-the-password", "a test")
    store = EtcdDatastore(etcd_server.address, retry_s=0.5, login=wrong)
    try:
        with pytest.raises(DatastoreDenied, match="refused the login of user 'faas-gpu'") as caught:
            store.get(KEY)
        assert "not-the-password" not in str(caught.value) and "not-the-password" not in repr(wrong)
    finally:
        store.close()


def test_the_daemons_etcd_user_may_write_only_under_faas_gpu(etcd_server):
    store = open_datastore(etcd_server.address, credentials_file=etcd_server.credentials_file)
    try:
        store.put("/faas-gpu/test-auth/k", "ok")
        with pytest.raises(DatastoreDenied, match="permission denied"):
            store.put("/elsewhere/k", "no")
    finally:
        store.close()


def test_an_anonymous_client_cannot_write_to_redis(redis_server):
    anonymous = redis.Redis.from_url(redis_server.address, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.xadd("faas-gpu:queue", {"body": '{"Function": "forged"}'})
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        anonymous.execute_command("AUTH", "default", "")  # the default user is off: no empty password
    queue = RedisStreamQueue(
        redis_server.address, stream="faas-gpu:test-auth", login=read_login(redis_server.credentials_file)
    )
    try:
        assert queue.pending_count() == 0  # the daemons' login gets in; nothing of the above was queued
        queue.put({"Function": "real"})
        assert queue.pending_count() == 1
    finally:
        queue.redis.delete("faas-gpu:test-auth")
        queue.close()


@pytest.mark.timeout(90)
def test_a_daemon_started_before_etcds_auth_was_turned_on_logs_in_once_it_is(tmp_path, caplog):
    """The deploy files start etcd, then turn its auth on beside the daemons: one that found it
    off warns that anyone may write, and logs in by itself when it is turned on."""
    from faas_gpu.datastore.etcd_auth import enable_auth
    from tests.servers import EtcdServer

    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd", auth=False)
    etcd.start()
    store = open_datastore(etcd.address, credentials_file=etcd.credentials_file)
    try:
        with caplog.at_level("WARNING", "faas_gpu.datastore.etcd"):
            store.put("/faas-gpu/k", "before")
        assert any("authentication off" in r.getMessage() for r in caplog.records)
        assert enable_auth(etcd.address, etcd.root_password, etcd.login)
        store.put("/faas-gpu/k", "after")
        assert store.get("/faas-gpu/k").value == b"after"
        with pytest.raises(DatastoreDenied):
            open_datastore(etcd.address, retry_s=0.5).get("/faas-gpu/k")
    finally:
        store.close()
        etcd.stop()
