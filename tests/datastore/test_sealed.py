"""The daemons' datastore checks every record's MAC (`faas_gpu.datastore.sealed`): a record that was
not sealed by this cluster's daemons is quarantined, never acted upon, on both back ends (the
embedded SQLite store of the default set-up, and a real etcd with the daemons' login).

What a forger writes here, they write with the store's own access (etcd's root password, or the
state folder's SQLite file): past the first wall, which tests/datastore/test_auth.py checks."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from faas_gpu import cordon, schedulers
from faas_gpu.contract import keys, records
from faas_gpu.datastore import SealedDatastore, open_datastore
from faas_gpu.fn_credentials import CredentialResolver, FunctionCredentials, token_digest

TOKEN = "the-cluster-token"


@pytest.fixture(params=["embedded", "etcd"])
def stores(request, tmp_path):
    """(the daemons' store, a forger's raw access to the same data, a key prefix of this test's own)."""
    if request.param == "embedded":
        path = tmp_path / "state.db"
        daemons, forger = open_datastore(None, path, cluster_token=TOKEN), open_datastore(None, path)
    else:
        etcd = request.getfixturevalue("etcd_server")
        daemons, forger = open_datastore(etcd.url, cluster_token=TOKEN), open_datastore(etcd.root_url)
    yield daemons, forger, f"/faas-gpu/test-sealed/{uuid.uuid4().hex[:8]}/"
    daemons.close()
    forger.close()


def test_a_forged_record_reads_as_absent_is_quarantined_and_stays_in_the_store(stores, caplog):
    ds, forger, p = stores
    ds.put(p + "good", "sealed")
    forger.put(p + "unsigned", "written by hand")
    forged = ds.seal(p + "elsewhere", "moved")  # sealed for another key
    forger.put(p + "moved", forged)
    with caplog.at_level(logging.ERROR, "faas_gpu.datastore.sealed"):
        assert ds.get(p + "unsigned") is None and ds.get(p + "moved") is None
        assert [kv.key for kv in ds.get_prefix(p)] == [p + "good"]
        ds.get_prefix(p)  # read again: not logged again
    assert ds.get(p + "good").value == b"sealed"
    assert {(q.key, q.reason) for q in ds.quarantined(p)} == {
        (p + "unsigned", records.UNSIGNED),
        (p + "moved", records.FORGED),
    }
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and all("quarantined" in m for m in logged)
    assert sum(p + "unsigned" in m for m in logged) == 1  # once, with its key
    # not deleted: the operator looks at it, and removes or replaces it
    assert forger.get(p + "unsigned").value == b"written by hand"
    ds.put(p + "unsigned", "redeployed")  # a daemon's own write replaces it
    assert ds.get(p + "unsigned").value == b"redeployed"
    ds.delete(p + "moved")
    assert ds.quarantined(p) == []


def test_a_forger_changing_a_record_again_is_logged_again(stores, caplog):
    ds, forger, p = stores
    with caplog.at_level(logging.ERROR, "faas_gpu.datastore.sealed"):
        forger.put(p + "k", "one")
        ds.get(p + "k")
        forger.put(p + "k", "two")
        ds.get(p + "k")
    assert len([r for r in caplog.records if p + "k" in r.getMessage()]) == 2


@pytest.mark.timeout(30)
def test_a_watch_delivers_a_forged_put_as_a_delete_without_its_value(stores):
    ds, _, p = stores
    watch = ds.watch_prefix(p)
    try:
        ds.put(p + "a", "sealed")
        ds.inner.put(p + "a", "forged over it")  # the raw store under it (embedded: watches see their own writes)
        events = [watch.get(timeout=10) for _ in range(2)]
    finally:
        watch.cancel()
    assert [(e.type, e.value) for e in events] == [("put", b"sealed"), ("delete", None)]


def test_leader_election_and_compare_and_swap_work_on_sealed_values(stores):
    ds, forger, p = stores
    assert ds.create(p + "leader", "me") and not ds.create(p + "leader", "you")
    assert ds.compare_and_swap(p + "leader", "you", expected_value=b"me")
    assert ds.get(p + "leader").value == b"you"
    assert records.is_sealed(forger.get(p + "leader").value)


def test_the_daemons_write_nothing_a_store_without_their_token_accepts(tmp_path):
    """Two clusters on one etcd (or a copy of the state folder without its secrets/): each one's
    records are forged to the other."""
    path = tmp_path / "state.db"
    ours, theirs = open_datastore(None, path, cluster_token=TOKEN), open_datastore(None, path, cluster_token="x")
    ours.put("/faas-gpu/functions/ns/f", "{}")
    assert theirs.get("/faas-gpu/functions/ns/f") is None
    assert [q.reason for q in theirs.quarantined()] == [records.FORGED]


# -- every key prefix the daemons act upon ----------------------------------------------------------
def _forge_everywhere(forger, fn_token: str) -> None:
    """What an intruder who can write the store would put under each prefix (keys.py's inventory)."""
    evil = "http://203.0.113.9:8090"
    forger.put(keys.unit("evil-node", "gpu-0"), json.dumps({"node": "evil-node", "unit": "gpu-0", "url": evil}))
    forger.put(keys.FUNCTIONS + "openfaas-fn/evil", json.dumps({"deployment": {"envProcess": "sh -c id"}}))
    forger.put(keys.FN_CREDENTIALS + token_digest(fn_token), json.dumps({"namespace": "openfaas-fn", "name": "x"}))
    forger.put(f"{keys.FN_MODELS}openfaas-fn/x/sha256:{'0' * 64}", "")
    forger.put(keys.SCHEDULER_MEMBERS + "evil", evil)
    forger.put(keys.SCHEDULER_LEADER, "evil")
    forger.put(keys.CORDON + "real-node", json.dumps({"node": "real-node", "reason": "forged"}))
    forger.put(keys.INSTANCES + "openfaas-fn/x", json.dumps([{"forged": True}]))


PREFIXES = {
    "UNITS": "unit reports: a manager URL the scheduler sends jobs and the cluster token to",
    "FUNCTIONS": "function records: what the provider starts",
    "FN_CREDENTIALS": "a function token's digest -> the function it acts for",
    "FN_MODELS": "the models a function may run",
    "SCHEDULER": "(the scheduler's keys below)",
    "SCHEDULER_MEMBERS": "announced schedulers: the URLs replicas send batches and their token to",
    "SCHEDULER_LEADER": "who places jobs",
    "CORDON": "nodes that take no work",
    "INSTANCES": "INFless's per-instance plans",
}


def test_every_prefix_of_the_contract_is_in_this_inventory():
    """A prefix added to keys.py must be added here, with what a forgery under it would do."""
    names = {n for n, v in vars(keys).items() if n.isupper() and isinstance(v, str) and v != keys.ROOT}
    assert names == set(PREFIXES)


def test_no_reader_of_any_prefix_sees_a_forged_record(tmp_path):
    """The core's readers of each prefix over the daemons' store, after a forger wrote under all of
    them (the scheduler's unit view and the provider's function store have their own tests:
    tests/scheduler/test_forged_units.py, tests/provider/test_forged_records.py)."""
    path = tmp_path / "state.db"
    ds, forger = open_datastore(None, path, cluster_token=TOKEN), open_datastore(None, path)
    assert isinstance(ds, SealedDatastore)
    fn_token = "a-token-the-intruder-made-up"
    _forge_everywhere(forger, fn_token)
    resolver = CredentialResolver(ds, TOKEN)
    assert resolver.resolve(fn_token) is None  # 401: the made-up token acts for no function
    creds = FunctionCredentials(ds, tmp_path / "function-tokens")
    real = resolver.resolve(creds.issue("openfaas-fn", "x"))
    assert real is not None and real.name == "x"  # what the provider issued still works
    assert not resolver.owns(real, "sha256:" + "0" * 64)
    assert schedulers.announced(ds) == []
    assert cordon.cordoned_nodes(ds) == {}
    assert ds.get(keys.SCHEDULER_LEADER) is None
    assert ds.get(keys.INSTANCES + "openfaas-fn/x") is None
    assert ds.get_prefix(keys.UNITS) == [] and ds.get_prefix(keys.FUNCTIONS) == []
    assert len(ds.quarantined(keys.ROOT)) == 8
