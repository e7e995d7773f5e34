"""`faas-gpu datastore`: the operator sees what is quarantined, adopts an older version's unsigned
records once (valid ones only, never a forged one), and turns etcd's authentication on the way
the deploy files do (a real etcd as it starts, a real Redis with the ACL file it writes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from faas_gpu.contract import keys, records
from faas_gpu.credentials import ensure_token, read_login
from faas_gpu.datastore import DatastoreDenied, open_datastore
from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port
from tests.servers import EtcdServer, _wait_port

NS = "openfaas-fn"


def _cli(home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", "datastore", *args],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "FAAS_GPU_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _function(service: str, **extra) -> str:
    deployment = {"service": service, "image": "x", "envProcess": "cat", **extra}
    return json.dumps({"deployment": deployment, "namespace": NS, "replicas": 1, "createdAt": "2026-01-01T00:00:00Z"})


def test_check_lists_the_quarantined_records_and_adopt_seals_only_unsigned_valid_ones(tmp_path):
    home = tmp_path / "home"
    token = ensure_token(home / "secrets")
    sealed, raw = open_datastore(None, home / "state.db", cluster_token=token), open_datastore(None, home / "state.db")
    try:
        sealed.put(f"{keys.FUNCTIONS}{NS}/current", _function("current"))
        raw.put(f"{keys.FUNCTIONS}{NS}/legacy", _function("legacy"))  # what an older version wrote
        raw.put(f"{keys.FUNCTIONS}{NS}/legacy-invalid", _function("legacy-invalid", envProcess="x" * 300_000))
        raw.put(f"{keys.FUNCTIONS}{NS}/forged", records.seal(records.record_key("other"), "k", b"{}"))
        raw.put(keys.CORDON + "node-1", json.dumps({"reason": "retired"}))

        out = _cli(home, "check")
        assert out.returncode == 1, out.stdout + out.stderr
        listed = [line for line in out.stdout.splitlines() if line.startswith("quarantined")]
        assert len(listed) == 4 and not any("/current" in line for line in listed), out.stdout
        assert any("/forged: its MAC fails" in line for line in listed)
        assert any("/legacy-invalid: no MAC" in line and "validation" in line for line in listed)

        out = _cli(home, "adopt")  # a dry run first
        assert out.returncode == 0 and "would seal" in out.stdout and "nothing written" in out.stdout
        assert sealed.get(f"{keys.FUNCTIONS}{NS}/legacy") is None

        out = _cli(home, "adopt", "--yes")
        assert out.returncode == 0, out.stderr
        assert sealed.get(f"{keys.FUNCTIONS}{NS}/legacy") is not None  # the provider may start it now
        assert sealed.get(keys.CORDON + "node-1") is not None
        assert sealed.get(f"{keys.FUNCTIONS}{NS}/legacy-invalid") is None  # still refused by validation
        assert sealed.get(f"{keys.FUNCTIONS}{NS}/forged") is None  # a bad MAC is never adopted
        assert "left quarantined" in out.stdout

        out = _cli(home, "check", "--delete")
        assert out.returncode == 0 and "deleted 2" in out.stdout, out.stdout
        assert raw.get(f"{keys.FUNCTIONS}{NS}/forged") is None
        assert _cli(home, "check").returncode == 0
    finally:
        sealed.close()
        raw.close()


def test_check_needs_the_state_folders_cluster_token(tmp_path):
    out = _cli(tmp_path / "nowhere", "check")
    assert out.returncode == 1 and "no cluster token" in out.stderr


@pytest.mark.timeout(120)
def test_enable_auth_turns_etcd_auth_on_and_writes_the_logins_and_redis_acl(tmp_path):
    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd", auth=False)  # as the deploy files start it
    etcd.start()
    home = tmp_path / "home"
    acl = tmp_path / "redis-acl" / "users.acl"
    redis_proc = None
    try:
        out = _cli(home, "enable-auth", "--etcd", etcd.address, "--redis-acl", str(acl))
        assert out.returncode == 0 and "authentication on" in out.stdout, out.stdout + out.stderr
        secrets = home / "secrets"
        for name in ("etcd-credentials", "etcd-root-credentials", "redis-credentials"):
            assert (secrets / name).stat().st_mode & 0o777 == 0o600, name
        login = read_login(secrets / "etcd-credentials")
        assert login.password not in out.stdout + out.stderr  # never printed
        with pytest.raises(DatastoreDenied):
            open_datastore(etcd.address, retry_s=0.5).put("/faas-gpu/x", "anonymous")
        daemons = open_datastore(etcd.address, secrets_dir=secrets)  # the daemons' default file
        daemons.put("/faas-gpu/x", "ours")
        daemons.close()
        again = _cli(home, "enable-auth", "--etcd", etcd.address)
        assert again.returncode == 0 and "already on" in again.stdout

        redis_login = read_login(secrets / "redis-credentials")
        assert redis_login.password not in acl.read_text()  # a hash only
        port = free_port()
        redis_proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--aclfile", str(acl)],
            stdout=subprocess.DEVNULL,
        )
        _wait_port(port, redis_proc, tmp_path / "none.log")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).set("faas-gpu:x", "1")
        ours = redis.Redis(port=port, username=redis_login.user, password=redis_login.password)
        assert ours.set("faas-gpu:x", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            ours.set("elsewhere", "1")  # the daemons' keys only
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
        etcd.stop()
