"""One contract, two back ends: the embedded store and etcd (a real etcd server)."""

from __future__ import annotations

import time
import uuid

import pytest

from faas_gpu.datastore import open_datastore
from faas_gpu.datastore.embedded import EmbeddedDatastore


@pytest.fixture(params=["embedded", "etcd", "embedded-sealed", "etcd-sealed"])
def ds(request, tmp_path):
    """Each back end raw, and as the daemons open it (sealed with a cluster token: the contract
    holds through the MAC, `faas_gpu.datastore.sealed`). etcd with the daemons' login."""
    token = "cluster-token" if request.param.endswith("-sealed") else None
    if request.param.startswith("embedded"):
        store = open_datastore(None, tmp_path / "state.db", cluster_token=token)
    else:
        store = open_datastore(request.getfixturevalue("etcd_server").url, cluster_token=token)
    yield store
    store.close()


@pytest.fixture
def p() -> str:
    """A key prefix of this test's own (etcd is shared by the whole session), under /faas-gpu/,
    where the daemons' etcd role may read and write."""
    return f"/faas-gpu/test/{uuid.uuid4().hex[:8]}/"


def test_put_get_and_revisions(ds, p):
    assert ds.get(p + "a") is None
    r1 = ds.put(p + "a", "one")
    kv = ds.get(p + "a")
    assert kv.value == b"one" and kv.version == 1 and kv.create_revision == kv.mod_revision == r1
    r2 = ds.put(p + "a", b"two")
    kv2 = ds.get(p + "a")
    assert r2 > r1 and kv2.value == b"two" and kv2.version == 2
    assert kv2.create_revision == r1 and kv2.mod_revision == r2


def test_prefix_is_sorted_and_bounded(ds, p):
    for k in ("b", "a", "c/d"):
        ds.put(p + k, k)
    ds.put(p[:-1] + "x", "outside")
    assert [kv.key for kv in ds.get_prefix(p)] == [p + "a", p + "b", p + "c/d"]
    assert ds.delete_prefix(p) == 3
    assert ds.get_prefix(p) == []
    assert ds.get(p[:-1] + "x").value == b"outside"


def test_delete(ds, p):
    ds.put(p + "k", "v")
    assert ds.delete(p + "k") is True
    assert ds.delete(p + "k") is False
    assert ds.get(p + "k") is None


def test_json_helpers(ds, p):
    ds.put_json(p + "j", {"a": [1, 2]})
    assert ds.get_json(p + "j") == {"a": [1, 2]}
    assert ds.get_json(p + "missing") is None


def test_create_only_if_absent(ds, p):
    assert ds.create(p + "leader", "me") is True
    assert ds.create(p + "leader", "you") is False
    assert ds.get(p + "leader").value == b"me"


def test_compare_and_swap(ds, p):
    ds.put(p + "c", "v1")
    assert ds.compare_and_swap(p + "c", "v2", expected_value=b"nope") is False
    assert ds.compare_and_swap(p + "c", "v2", expected_value=b"v1") is True
    rev = ds.get(p + "c").mod_revision
    assert ds.compare_and_swap(p + "c", "v3", expected_mod_revision=rev - 1) is False
    assert ds.compare_and_swap(p + "c", "v3", expected_mod_revision=rev) is True
    assert ds.get(p + "c").value == b"v3"
    assert ds.compare_and_swap(p + "absent", "x", expected_value=b"") is False
    with pytest.raises(ValueError):
        ds.compare_and_swap(p + "c", "x")


@pytest.mark.timeout(30)
def test_lease_expiry_removes_keys_and_refresh_keeps_them(ds, p):
    short = ds.lease(1)
    kept = ds.lease(2)
    ds.put(p + "short", "x", lease=short)
    ds.put(p + "kept", "y", lease=kept)
    assert ds.get(p + "short").lease == short.id
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        kept.refresh()
        if ds.get(p + "short") is None:
            break
        time.sleep(0.3)
    assert ds.get(p + "short") is None
    assert ds.get(p + "kept") is not None
    kept.revoke()
    assert ds.get(p + "kept") is None


@pytest.mark.timeout(30)
def test_watch_sees_puts_and_deletes_in_order(ds, p):
    watch = ds.watch_prefix(p)
    time.sleep(0.2)  # etcd: the watch is registered asynchronously
    ds.put(p + "a", "1")
    ds.put(p + "b", "2")
    ds.delete(p + "a")
    ds.put(p[:-1] + "-other", "ignored")
    events = [watch.get(timeout=5) for _ in range(3)]
    assert [(e.type, e.key) for e in events] == [("put", p + "a"), ("put", p + "b"), ("delete", p + "a")]
    assert events[0].value == b"1" and events[2].value is None
    assert events[0].mod_revision < events[1].mod_revision < events[2].mod_revision
    watch.cancel()
    assert watch.get(timeout=0.5) is None


@pytest.mark.timeout(30)
def test_a_watch_sees_what_changed_after_the_call_before_its_stream_opened(etcd_server, p, monkeypatch):
    """etcd: the stream is opened by the watch's thread a moment after `watch_prefix` returns; a
    put made meanwhile is delivered (the watch starts from the store's revision at the call, not
    from whatever etcd's "now" is once the stream opens)."""
    store = open_datastore(etcd_server.url)
    opened = store.client.watch_prefix

    def slow_to_open(*args, **kwargs):
        time.sleep(0.5)
        return opened(*args, **kwargs)

    monkeypatch.setattr(store.client, "watch_prefix", slow_to_open)
    try:
        watch = store.watch_prefix(p)
        store.put(p + "k", "meanwhile")
        event = watch.get(timeout=10)
        assert event is not None and (event.type, event.value) == ("put", b"meanwhile")
        watch.cancel()
    finally:
        store.close()


@pytest.mark.timeout(30)
def test_watch_from_a_past_revision_replays(ds, p):
    first = ds.put(p + "x", "1")
    ds.put(p + "x", "2")
    watch = ds.watch_prefix(p, start_revision=first)
    values = [watch.get(timeout=5).value for _ in range(2)]
    watch.cancel()
    assert values == [b"1", b"2"]


def test_embedded_persists_across_reopen(tmp_path):
    path = tmp_path / "state.db"
    a = EmbeddedDatastore(path)
    rev = a.put("/k", "v")
    a.close()
    b = EmbeddedDatastore(path)
    try:
        assert b.get("/k").value == b"v"
        assert b.put("/k", "w") > rev
    finally:
        b.close()


def test_unknown_datastore_url_is_refused():
    with pytest.raises(ValueError, match="datastore URL"):
        open_datastore("ftp://example")


@pytest.mark.timeout(60)
def test_etcd_client_rides_out_an_etcd_restart(etcd_server):
    ds = open_datastore(etcd_server.url)
    try:
        ds.put("/faas-gpu/restart/k", "before")
        watch = ds.watch_prefix("/faas-gpu/restart/")
        time.sleep(0.2)
        etcd_server.restart()
        assert ds.get("/faas-gpu/restart/k").value == b"before"
        ds.put("/faas-gpu/restart/k", "after")
        _wait_for_value(watch, b"after")
        watch.cancel()
    finally:
        ds.close()


def _wait_for_value(watch, value: bytes) -> None:
    """The watch delivers `value` (after any events before it)."""
    event = watch.get(timeout=20)
    while event is not None and event.value != value:
        event = watch.get(timeout=20)
    assert event is not None and event.value == value


def test_embedded_store_raises_datastore_unavailable_when_sqlite_fails(tmp_path):
    """The same typed error as etcd's: a write blocked by another process's lock past SQLite's
    busy timeout is the store being unavailable, not a bare sqlite3 error (a 500 upstream)."""
    import sqlite3

    from faas_gpu.datastore import DatastoreUnavailable

    ds = open_datastore(None, tmp_path / "state.db")
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        ds.put("/k", "before")
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(DatastoreUnavailable, match="embedded"):
            ds.put("/k", "blocked")
        other.execute("ROLLBACK")
        ds.put("/k", "after")
        assert ds.get("/k").value == b"after"
    finally:
        other.close()
        ds.close()


@pytest.mark.timeout(90)
def test_etcd_down_raises_datastore_unavailable_fast_then_recovers(tmp_path):
    """A private etcd (the session's is shared): stopped, calls raise the typed error, the second
    at once; a watch and the client both resume by themselves when it returns."""
    from faas_gpu.datastore import DatastoreUnavailable
    from tests.servers import EtcdServer

    (tmp_path / "etcd").mkdir()
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    ds = open_datastore(server.url, timeout_s=1.0, retry_s=1.0)
    try:
        ready = time.monotonic() + 30
        while True:  # a fresh etcd on a loaded machine may take longer than one call's retries
            try:
                ds.put("/faas-gpu/down/k", "before")
                break
            except DatastoreUnavailable:
                assert time.monotonic() < ready, "etcd did not start"
        watch = ds.watch_prefix("/faas-gpu/down/")
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(DatastoreUnavailable, match="etcd"):
            ds.get("/faas-gpu/down/k")
        first_s = time.monotonic() - t0
        t1 = time.monotonic()
        with pytest.raises(DatastoreUnavailable, match="datastore"):
            ds.get_prefix("/faas-gpu/down/")
        assert time.monotonic() - t1 <= first_s  # known down: no second wait for retries
        assert first_s < 10  # bounded by retry_s and the call timeout, not the old 30 s
        time.sleep(3)  # long enough for gRPC's default backoff to grow
        server.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                ds.put("/faas-gpu/down/k", "after")
                break
            except DatastoreUnavailable:
                assert time.monotonic() < deadline, "etcd came back but the client never reconnected"
                time.sleep(0.1)
        assert ds.get("/faas-gpu/down/k").value == b"after"
        _wait_for_value(watch, b"after")
        watch.cancel()
    finally:
        ds.close()
        server.stop()
