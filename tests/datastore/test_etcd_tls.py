"""etcd over TLS with client certificates (`--client-cert-auth`): the other way etcd keeps anonymous
clients out. The daemons dial an https:// etcd with the CA and their client certificate from the
state folder's secrets/ (`etcd-ca.crt`, `etcd-client.crt`, `etcd-client.key`); a client without
one is refused. A real etcd with certificates openssl makes for the test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from faas_gpu.datastore import DatastoreUnavailable, open_datastore
from tests.servers import EtcdServer


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def certificates(tmp_path) -> Path:
    """A CA, etcd's certificate for 127.0.0.1, and a client's, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl")
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return d


class _TlsEtcd(EtcdServer):
    def __init__(self, workdir: Path, pki: Path):
        super().__init__(workdir, auth=False)  # the client certificate is the wall here
        self.pki = pki

    @property
    def address(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        argv = [a.replace(f"http://127.0.0.1:{self.port}", self.address) for a in super()._argv()]
        p = self.pki
        return [*argv, "--cert-file", str(p / "server.crt"), "--key-file", str(p / "server.key"),
                "--trusted-ca-file", str(p / "ca.crt"), "--client-cert-auth"]  # fmt: skip


def _secrets(folder: Path, pki: Path, *, client: bool) -> Path:
    folder.mkdir(parents=True)
    shutil.copy(pki / "ca.crt", folder / "etcd-ca.crt")
    if client:
        shutil.copy(pki / "client.crt", folder / "etcd-client.crt")
        shutil.copy(pki / "client.key", folder / "etcd-client.key")
    return folder


@pytest.mark.timeout(120)
def test_an_https_etcd_takes_the_daemons_client_certificate_and_refuses_a_client_without_one(tmp_path, certificates):
    (tmp_path / "etcd").mkdir()
    etcd = _TlsEtcd(tmp_path / "etcd", certificates)
    etcd.start()
    try:
        daemons = open_datastore(
            etcd.address, secrets_dir=_secrets(tmp_path / "daemons", certificates, client=True), cluster_token="t"
        )
        daemons.put("/faas-gpu/tls/k", "over TLS")
        assert daemons.get("/faas-gpu/tls/k").value == b"over TLS"
        daemons.close()
        for secrets in (_secrets(tmp_path / "no-cert", certificates, client=False), None):
            anonymous = open_datastore(etcd.address, secrets_dir=secrets, retry_s=1.0)
            with pytest.raises(DatastoreUnavailable):
                anonymous.put("/faas-gpu/tls/k", "forged")
            anonymous.close()
        plain = open_datastore(etcd.address.replace("https", "http"), retry_s=1.0)
        with pytest.raises(DatastoreUnavailable):
            plain.get("/faas-gpu/tls/k")
        plain.close()
    finally:
        etcd.stop()
