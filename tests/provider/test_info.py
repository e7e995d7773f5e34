"""/system/info's ProviderInfo names what really runs the replicas (faas-provider's `orchestration`)."""

from __future__ import annotations

import pytest

from provider.config import ProviderConfig
from provider.core import Provider


@pytest.mark.parametrize(
    "runtime, orchestration",
    [("local", "local-process"), ("docker", "docker"), ("swarm", "swarm"), (None, "local-process")],
)
def test_provider_info_names_the_runtimes_orchestration(tmp_path, runtime, orchestration):
    """As each OpenFaaS provider names its own (faasd `containerd`, faas-swarm `swarm`,
    faas-netes `kubernetes`): under `--runtime docker` it is the Docker engine, not processes."""
    provider = Provider(ProviderConfig(home=tmp_path, runtime=runtime), *([None] * 8))  # info reads the config only
    info = provider.info()
    assert info["provider"] == "faas-gpu" and info["orchestration"] == orchestration
    assert set(info["version"]) == {"sha", "release"}
