import os
import shutil
import tempfile

import pytest

pytest_plugins = ["tests.servers"]


def pytest_configure(config):
    """No test reads or writes the user's own faas-gpu config (the running-stack record `up`
    writes): the session gets a folder of its own before any fixture starts a stack."""
    config._faas_gpu_config = tempfile.mkdtemp(prefix="faas-gpu-config-")
    os.environ["FAAS_GPU_CONFIG"] = config._faas_gpu_config
    # stacks started by tests run side by side: none takes the fixed metrics port 8082 unless
    # the test gives it a free one (`--metrics-port`, as StackProcess does)
    os.environ.setdefault("FAAS_GPU_METRICS_PORT", "0")


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "_faas_gpu_config", ""), ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_faas_gpu_config(tmp_path_factory, monkeypatch):
    """Each test its own record, so a stack one test starts is never found by the next."""
    monkeypatch.setenv("FAAS_GPU_CONFIG", str(tmp_path_factory.mktemp("faas-gpu-config")))
