"""The provider never launches a function record it did not write (issue 41, finding 1).

The attack: a function record (`envProcess: sh -c ...`, replicas 0) put straight into the
datastore, then an anonymous `GET /function/<name>` that scales it from zero. Here the record is
put with etcd's root password (what the SSRF did on an etcd without authentication), or into the
state folder's SQLite file (the embedded default), and the call arrives: it must answer 404, run
nothing, say why to the operator, and leave the record where it is. Real stack processes, a real
etcd."""

from __future__ import annotations

import json
import time

import requests

from faas_gpu.contract import keys
from faas_gpu.datastore import open_datastore
from tests.stack_process import StackProcess

NS = "openfaas-fn"


def _record(service: str, marker, replicas: int = 0) -> str:
    deployment = {
        "service": service,
        "image": f"functions/{service}:latest",
        "envProcess": f"sh -c 'touch {marker}; cat'",
    }
    return json.dumps(
        {"deployment": deployment, "namespace": NS, "replicas": replicas, "createdAt": "2026-01-01T00:00:00Z"}
    )


def _deploy(s: StackProcess, name: str) -> None:
    body = {"service": name, "image": f"functions/{name}:latest", "envProcess": "cat"}
    r = requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10)
    assert r.status_code == 202, r.text


def _assert_never_launched(s: StackProcess, name: str, marker) -> None:
    for path in (f"/function/{name}", f"/function/{name}.{NS}"):
        r = requests.get(f"{s.url}{path}", timeout=30)  # anonymous, as the attacker's call was
        assert r.status_code == 404, (path, r.status_code, r.text)
    r = requests.post(f"{s.url}/system/scale-function/{name}", json={"replicas": 1}, auth=s.auth, timeout=10)
    assert r.status_code == 404, r.text
    time.sleep(1)
    assert not marker.exists(), f"{name}'s forged envProcess ran"


def test_a_function_record_forged_into_etcd_is_never_launched(tmp_path, etcd_server):
    s = StackProcess(tmp_path / "home", *etcd_server.daemon_args()).start()
    intruder = open_datastore(etcd_server.root_url)
    forged_key = f"{keys.FUNCTIONS}{NS}/forged"
    try:
        _deploy(s, "genuine")
        s.wait_ready("genuine")
        marker = tmp_path / "forged-ran"
        intruder.put(forged_key, _record("forged", marker))
        _assert_never_launched(s, "forged", marker)
        # the genuine function's sealed record, moved under another name and changed: its MAC fails
        genuine = intruder.get(f"{keys.FUNCTIONS}{NS}/genuine").value
        tampered = tmp_path / "tampered-ran"
        moved = genuine.replace(b'"genuine"', b'"moved"').replace(
            b'"cat"', f"\"sh -c 'touch {tampered}; cat'\"".encode()
        )
        intruder.put(f"{keys.FUNCTIONS}{NS}/moved", moved)
        _assert_never_launched(s, "moved", tampered)

        listed = requests.get(f"{s.url}/system/functions", auth=s.auth, timeout=10).json()
        assert [f["name"] for f in listed] == ["genuine"]
        r = requests.get(f"{s.url}/system/function/forged", auth=s.auth, timeout=10)
        assert r.status_code == 404 and "quarantined" in r.text and "MAC" in r.text, r.text  # for the operator
        assert requests.post(f"{s.url}/function/genuine", data=b"still", timeout=10).content == b"still"
        log = s.log_path.read_text()
        assert log.count(f"quarantined the datastore record {forged_key} ") == 1  # once, with its key
        assert intruder.get(forged_key) is not None  # left for the operator, not deleted
    finally:
        s.stop()
        intruder.delete_prefix(keys.FUNCTIONS)
        intruder.close()
    # a restarted provider does not start it either (restore reads every record)
    marker.unlink(missing_ok=True)
    intruder = open_datastore(etcd_server.root_url)
    intruder.put(forged_key, _record("forged", marker, replicas=1))
    s.start()
    try:
        time.sleep(2)
        assert not marker.exists()
        assert requests.get(f"{s.url}/function/forged", timeout=30).status_code == 404
    finally:
        s.stop()
        intruder.delete_prefix(keys.FUNCTIONS)
        intruder.close()


def test_a_function_record_written_into_the_embedded_store_is_never_launched(tmp_path):
    """The default set-up: whoever can write the state folder's SQLite file (not the daemons'
    secrets/) writes a record; the provider, before and after a restart, starts none of it."""
    home = tmp_path / "home"
    s = StackProcess(home).start()
    marker = tmp_path / "forged-ran"
    try:
        _deploy(s, "genuine")
        s.wait_ready("genuine")
        raw = open_datastore(None, home / "state.db")
        raw.put(f"{keys.FUNCTIONS}{NS}/forged", _record("forged", marker))
        raw.close()
        _assert_never_launched(s, "forged", marker)
    finally:
        s.stop()
    raw = open_datastore(None, home / "state.db")
    raw.put(f"{keys.FUNCTIONS}{NS}/at-restart", _record("at-restart", marker, replicas=1))
    raw.close()
    s.start()
    try:
        s.wait_ready("genuine")  # the genuine one is restored ...
        _assert_never_launched(s, "at-restart", marker)  # ... the forged one is not
        r = requests.get(f"{s.url}/system/function/at-restart", auth=s.auth, timeout=10)
        assert r.status_code == 404 and "quarantined" in r.text
    finally:
        s.stop()
