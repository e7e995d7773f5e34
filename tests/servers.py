"""Real etcd and Redis servers for the tests (Debian's etcd-server and redis-server).

Each runs on free loopback ports with its own temporary folder for the whole session, and
can be restarted by a test to prove that our daemons ride out a peer's restart.

Both run with authentication, as every set-up faas-gpu documents does: etcd with users and roles
(`faas_gpu.datastore.etcd_auth`: `root`, and the daemons' `faas-gpu` user, read/write under
/faas-gpu/ only), Redis with an ACL user (keys faas-gpu:* only) and its default user off. What a test hands the stack:
- `credentials_file`: the daemons' login as a file (`--etcd-credentials` / `--redis-credentials`),
  and `daemon_args()`, the flags with the URL and that file;
- `url`: the URL with the daemons' login in it (`http://faas-gpu:…@127.0.0.1:port`), for tests that
  open a client themselves (a URL's userinfo is what operators may pass too);
- `address`: the bare URL, what an anonymous client reaches; etcd's `root_url` for a test that must
  write where the daemons' role may not, or as an intruder holding etcd's root password would.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from faas_gpu.credentials import Login, redis_acl, write_login
from faas_gpu.ports import free_port


def _need(binary: str) -> str:
    path = shutil.which(binary)
    if path:
        return path
    message = f"{binary} is not installed (make test installs Debian's etcd-server and redis-server)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port}:\n{log.read_text()[-3000:]}")


class _Server:
    DAEMON_USER = "faas-gpu"
    FLAG = ""  # the daemons' flag for this server's URL ("--etcd")

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "server.log"
        self.login = Login(self.DAEMON_USER, secrets.token_urlsafe(16), "the test fixture")
        self.credentials_file = workdir / "daemon-credentials"
        write_login(self.credentials_file, self.login)

    @property
    def address(self) -> str:
        raise NotImplementedError

    @property
    def url(self) -> str:
        """The address with the daemons' login as userinfo."""
        scheme, rest = self.address.split("://", 1)
        return f"{scheme}://{self.login.user}:{self.login.password}@{rest}"

    def daemon_args(self) -> list[str]:
        """The flags a daemon is started with: the bare URL and the login's file (nothing in `ps`)."""
        return [self.FLAG, self.address, f"{self.FLAG}-credentials", str(self.credentials_file)]

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self._argv(), stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        _wait_port(self.port, self.proc, self.log)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, down_s: float = 0.5) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


class EtcdServer(_Server):
    FLAG = "--etcd"

    def __init__(self, workdir: Path, auth: bool = True):
        super().__init__(workdir)
        self.binary = _need("etcd")
        self.port, self.peer_port = free_port(), free_port()
        self.root_password = secrets.token_urlsafe(16)
        self._auth_on = not auth  # auth=False: as etcd starts, for a test that turns it on itself

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def root_url(self) -> str:
        """etcd's administrator: may read and write every key (what an intruder with it could do)."""
        return f"http://root:{self.root_password}@127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> None:
        super().start()
        if not self._auth_on:  # once: the data folder keeps users and roles across restarts
            from faas_gpu.datastore.etcd_auth import enable_auth

            deadline = time.monotonic() + 30
            while True:
                try:
                    enable_auth(self.address, self.root_password, self.login)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            self._auth_on = True

    def _argv(self) -> list[str]:
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary,
            "--name",
            "test",
            "--data-dir",
            str(self.workdir / "data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"test={peer}",
            "--initial-cluster-state",
            "new",
            "--bcrypt-cost",
            "4",  # the fewest rounds etcd takes: each login costs the machine less (a test setting)
            "--log-level",
            "error",
        ]


class RedisServer(_Server):
    FLAG = "--redis"

    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.binary = _need("redis-server")
        self.port = free_port()
        self.acl_file = workdir / "users.acl"  # as the deploy files make it (`faas-gpu datastore enable-auth`)
        self.acl_file.write_text(redis_acl(self.login))

    @property
    def address(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            str(self.workdir),
            "--protected-mode",
            "yes",
            "--aclfile",
            str(self.acl_file),
        ]


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()
