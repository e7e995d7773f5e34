"""Real etcd and Redis servers for the tests (Debian's etcd-server and redis-server).

Each runs on free loopback ports with its own temporary folder for the whole session, and
can be restarted by a test to prove that our daemons ride out a peer's restart.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

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
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "server.log"

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
    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.binary = _need("etcd")
        self.port, self.peer_port = free_port(), free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

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
            "--log-level",
            "error",
        ]


class RedisServer(_Server):
    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.binary = _need("redis-server")
        self.port = free_port()

    @property
    def url(self) -> str:
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
