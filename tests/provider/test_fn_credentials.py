"""Per-function GPU-path credentials: issued at deploy, private on disk, hashed in the datastore,
bound to the function and its uploads, revoked on remove (within the scheduler's cache time)."""

from __future__ import annotations

import stat

from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import CLUSTER, Caller, CredentialResolver, FunctionCredentials


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_functions_token_is_private_on_disk_and_only_hashed_in_the_datastore(tmp_path):
    ds = open_datastore(None, tmp_path / "state.db")
    creds = FunctionCredentials(ds, tmp_path / "secrets" / "function-tokens")
    token = creds.issue("openfaas-fn", "classify")
    assert creds.issue("openfaas-fn", "classify") == token == creds.token("openfaas-fn", "classify")
    folder = tmp_path / "secrets" / "function-tokens"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert [stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()] == [0o600]
    dump = b"".join(kv.key.encode() + kv.value for kv in ds.get_prefix("/faas-gpu/"))
    assert token.encode() not in dump  # a copy of the datastore gives no usable token
    assert creds.issue("openfaas-fn", "other") != token
    # a name is never a path
    creds.issue("openfaas-fn", "../../escape")
    assert not (tmp_path / "escape").exists() and len(list(folder.iterdir())) == 3


def test_the_scheduler_resolves_tokens_and_a_revoked_one_stops_within_the_cache_time(tmp_path):
    ds = open_datastore(None, tmp_path / "state.db")
    creds = FunctionCredentials(ds, tmp_path / "tokens")
    clock = Clock()
    resolver = CredentialResolver(ds, "cluster-secret", cache_s=2.0, clock=clock)
    token = creds.issue("openfaas-fn", "classify")
    me = Caller("openfaas-fn", "classify")
    assert resolver.resolve("cluster-secret") is CLUSTER
    assert resolver.resolve(token) == me
    assert resolver.resolve("guess") is None and resolver.resolve("ä") is None and resolver.resolve(None) is None
    resolver.record_upload(me, "a" * 64)
    assert resolver.owns(me, "a" * 64) and not resolver.owns(me, "b" * 64)
    assert not resolver.owns(Caller("openfaas-fn", "other"), "a" * 64)
    assert resolver.owns(CLUSTER, "b" * 64)
    creds.revoke("openfaas-fn", "classify")
    assert resolver.resolve(token) == me  # cached ...
    clock.now += 2.1
    assert resolver.resolve(token) is None  # ... for at most cache_s
    assert not resolver.owns(me, "a" * 64)  # its uploads are forgotten with it
    assert creds.issue("openfaas-fn", "classify") != token  # a redeploy gets a new token


class _Away:
    """A datastore that has gone away: every read raises, as both back ends do."""

    def __init__(self, ds) -> None:
        self.ds, self.down = ds, False

    def __getattr__(self, name):
        if self.down:
            from faas_gpu.datastore import DatastoreUnavailable

            def unavailable(*_a, **_k):
                raise DatastoreUnavailable("datastore (test) is unavailable")

            return unavailable
        return getattr(self.ds, name)


def test_a_known_function_keeps_its_access_while_the_datastore_is_away_and_an_unknown_one_is_503(tmp_path):
    import pytest

    from faas_gpu.datastore import DatastoreUnavailable

    ds = open_datastore(None, tmp_path / "state.db")
    creds = FunctionCredentials(ds, tmp_path / "tokens")
    known, unknown = creds.issue("openfaas-fn", "classify"), creds.issue("openfaas-fn", "other")
    away, clock = _Away(ds), Clock()
    resolver = CredentialResolver(away, "cluster-secret", cache_s=2.0, clock=clock)
    caller = resolver.resolve(known)
    resolver.record_upload(caller, "d" * 64)
    away.down, clock.now = True, 60.0  # long past the cache time
    assert resolver.resolve(known) == caller and resolver.owns(caller, "d" * 64)
    assert resolver.resolve("cluster-secret") is CLUSTER
    with pytest.raises(DatastoreUnavailable):  # never seen: the caller gets a 503, not a guess
        resolver.resolve(unknown)
    with pytest.raises(DatastoreUnavailable):
        resolver.owns(caller, "e" * 64)


class _Stalled:
    """A datastore that does not answer (etcd stopped, or a partition): every call blocks until
    `answer` is set, then goes through."""

    def __init__(self, ds) -> None:
        import threading

        self.ds, self.answer = ds, threading.Event()
        self.answer.set()

    def __getattr__(self, name):
        inner = getattr(self.ds, name)

        def call(*a, **k):
            self.answer.wait()
            return inner(*a, **k)

        return call


def _in_thread(fn, *args):
    """`fn(*args)` on a thread; (done, result) after up to 10 s."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    t.join(10)
    return bool(out), (out[0] if out else None)


def test_a_known_function_is_answered_without_waiting_on_a_datastore_that_does_not_answer(tmp_path):
    """Issue 42: the job routes ask who calls and whether they own the model; for a function the
    scheduler knows, neither waits on the datastore (they did: every job past the cache time waited
    on etcd's retries), and an upload made while the datastore does not answer is the function's
    at once and written once the datastore answers again."""
    ds = open_datastore(None, tmp_path / "state.db")
    creds = FunctionCredentials(ds, tmp_path / "tokens")
    known = creds.issue("openfaas-fn", "classify")
    stalled, clock = _Stalled(ds), Clock()
    resolver = CredentialResolver(stalled, "cluster-secret", cache_s=2.0, clock=clock)
    caller = resolver.resolve(known)
    resolver.record_upload(caller, "d" * 64)
    stalled.answer.clear()  # from here the datastore takes every call and answers none
    try:
        for now in (1.5, 2.5, 60.0):  # aging, expired, long expired
            clock.now = now
            assert _in_thread(resolver.resolve, known) == (True, caller), now
            assert _in_thread(resolver.owns, caller, "d" * 64) == (True, True), now
        done, _ = _in_thread(resolver.record_upload, caller, "e" * 64)  # a replica restarted meanwhile
        assert done
        assert _in_thread(resolver.owns, caller, "e" * 64) == (True, True)
    finally:
        stalled.answer.set()
    import time

    deadline = time.monotonic() + 10
    while ds.get("/faas-gpu/fn-models/openfaas-fn/classify/" + "e" * 64) is None:  # written once it answers
        resolver.owns(caller, "e" * 64)
        assert time.monotonic() < deadline, "the upload made during the outage was never recorded"
        time.sleep(0.05)


def test_an_upload_keeps_the_batch_its_model_accepts_for_describe_and_the_planner(tmp_path):
    """Issue 43: the scheduler records what batch the uploaded model accepts with the upload
    (a sealed record); a record without one, or garbled, reads as unknown (calls one at a time)."""
    from faas_gpu.fn_credentials import uploaded_batches
    from faas_gpu.models.batch_limits import BatchLimits

    ds = open_datastore(None, tmp_path / "state.db")
    resolver = CredentialResolver(ds, "cluster-secret")
    me = Caller("openfaas-fn", "classify")
    resolver.record_upload(me, "a" * 64, BatchLimits("static", 1, 1))
    resolver.record_upload(me, "b" * 64, BatchLimits("dynamic", 1, 64))
    resolver.record_upload(me, "c" * 64)  # an older scheduler's record
    resolver.record_upload(Caller("openfaas-fn", "other"), "d" * 64, BatchLimits("dynamic", 1, None))
    ds.put("/faas-gpu/fn-models/openfaas-fn/classify/" + "e" * 64, "{not json")
    got = {d[0]: b.text() for d, b in uploaded_batches(ds, "openfaas-fn", "classify").items()}
    assert got == {
        "a": "static 1",
        "b": "dynamic 1..64",
        "c": "unknown (not read): calls run one at a time",
        "e": "unknown (not read): calls run one at a time",
    }
    assert resolver.owns(me, "a" * 64) and resolver.owns(me, "c" * 64)  # the value changes nothing of that


def test_a_functions_status_names_the_batch_of_each_model_it_uploaded(tmp_path):
    """`faasGpuModels` in one function's status (what `faas-gpu describe` prints, issue 43); a
    datastore that does not answer leaves it out rather than failing the description."""
    from faas_gpu.models.batch_limits import BatchLimits
    from provider.config import ProviderConfig
    from provider.core import Provider
    from provider.types import FunctionDeployment, FunctionRecord

    class Runtime:
        def endpoints(self, ns, name):
            return []

        def problem(self, ns, name):
            return None

        def rollout(self, ns, name):
            return None

    class Invoker:
        counts: dict = {}

    ds = _Away(open_datastore(None, tmp_path / "state.db"))
    CredentialResolver(ds, "cluster-secret").record_upload(
        Caller("openfaas-fn", "tiny"), "a" * 64, BatchLimits("static", 1, 1)
    )
    provider = Provider(ProviderConfig(home=tmp_path), None, ds, None, None, None, Runtime(), Invoker(), None)
    record = FunctionRecord(FunctionDeployment.from_json({"service": "tiny", "image": "img"}), "openfaas-fn", 1)
    assert provider.status(record, detail=True)["faasGpuModels"] == [
        {"digest": "a" * 64, "batch": {"kind": "static", "min": 1, "max": 1, "text": "static 1"}}
    ]
    assert "faasGpuModels" not in provider.status(record)  # the list of functions reads no upload record
    ds.down = True
    assert "faasGpuModels" not in provider.status(record, detail=True)
