"""What every test folder shares: the real etcd and Redis servers (`tests.servers`, a plugin, which
pytest allows only here), a faas-gpu config of each test's own, and the scheduler/GPU Manager
cluster the scheduler, client and end-to-end tests start. Fixtures of one folder live in that
folder's conftest.py."""

import os
import shutil
import tempfile

import pytest

from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from tests.daemon_process import Daemon

pytest_plugins = ["tests.servers", "tests.docker_fixtures"]


def pytest_configure(config):
    """No test reads or writes the user's own faas-gpu config (the running-stack record `up`
    writes): the session gets a folder of its own before any fixture starts a stack."""
    config._faas_gpu_config = tempfile.mkdtemp(prefix="faas-gpu-config-")
    os.environ["FAAS_GPU_CONFIG"] = os.path.join(config._faas_gpu_config, "config.yml")
    # stacks started by tests run side by side: none takes the fixed metrics port 8082 unless
    # the test gives it a free one (`--metrics-port`, as StackProcess does)
    os.environ.setdefault("FAAS_GPU_METRICS_PORT", "0")


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "_faas_gpu_config", ""), ignore_errors=True)


_WEIGHTS_ONLY_FLAGS = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


@pytest.fixture(autouse=True)
def _weights_only_flags_restored():
    """The GPU Manager's loader forces `torch.load` to weights only for the whole process it runs
    in (a worker's, as it should); a test that calls it in pytest's own process must not leave that
    on for the tests after it (a client test loading its own pickle failed when it ran after the
    gpu_manager tests)."""
    before = {k: os.environ.get(k) for k in _WEIGHTS_ONLY_FLAGS}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _own_faas_gpu_config(tmp_path_factory, monkeypatch):
    """Each test its own record, so a stack one test starts is never found by the next."""
    monkeypatch.setenv("FAAS_GPU_CONFIG", str(tmp_path_factory.mktemp("faas-gpu-config") / "config.yml"))


@pytest.fixture
def cluster(tmp_path, etcd_server):
    """Returns a starter of scheduler and GPU Manager daemons on the session's etcd, and the
    cluster token's auth header; everything it started is killed at the end. Here, not in one
    folder, because the scheduler, client and GPU-path tests all start such a cluster. A test that
    writes records the daemons act upon opens the store as they do: with the token in
    `tmp_path / "secrets"` (`open_datastore(..., cluster_token=ensure_token(...))`)."""
    started: list[Daemon] = []
    prefix = "/faas-gpu/units/"
    ds = open_datastore(etcd_server.url)
    ds.delete_prefix(prefix)
    ds.delete_prefix("/faas-gpu/scheduler/")
    token = ensure_token(tmp_path / "secrets")

    def start(module: str, *args: str) -> Daemon:
        d = Daemon(module, tmp_path, *etcd_server.daemon_args(), *args)
        started.append(d)
        return d

    yield start, {"Authorization": f"Bearer {token}"}
    for d in started:
        d.kill()
    ds.delete_prefix(prefix)
    ds.delete_prefix("/faas-gpu/scheduler/")
    ds.close()
