"""The container spec of a replica, without an engine: labels, env, mounts, limits, ports."""

from __future__ import annotations

import pytest

from provider.runtime.base import InstanceSpec, LaunchError
from provider.runtime.containers import (
    MIN_MEMORY_BYTES,
    SECRETS_PATH,
    memory_bytes,
    plan_container,
    replica_container,
    resources,
)
from provider.types import FunctionDeployment, FunctionRecord


def record(**fields) -> FunctionRecord:
    body = {"service": "classify", "image": "faas-gpu/classify:latest", **fields}
    return FunctionRecord(FunctionDeployment.from_json(body), "openfaas-fn", 1)


def plan(rec: FunctionRecord | None = None, **kwargs):
    kwargs.setdefault("image_id", "sha256:abc")
    kwargs.setdefault("owner", "owner1")
    kwargs.setdefault("stop_timeout_s", 35.0)
    return plan_container(rec or record(), **kwargs)


def test_openfaas_labels_as_the_real_providers_set_them():
    p = plan(record(labels={"com.openfaas.scale.min": "2"}, annotations={"com.faas-gpu.slo-ms": "250"}))
    assert p.labels["com.openfaas.function"] == "classify"
    assert p.labels["faas_function"] == "classify"
    assert p.labels["function"] == "true"
    assert p.labels["com.openfaas.scale.min"] == "2"
    assert p.labels["com.openfaas.annotations.com.faas-gpu.slo-ms"] == "250"  # faasd's prefix
    assert p.labels["com.faas-gpu.owner"] == "owner1"


def test_a_label_that_clashes_with_an_annotation_is_refused_as_faasd_refuses_it():
    with pytest.raises(LaunchError, match="clashes"):
        plan(record(labels={"com.openfaas.annotations.x": "1"}, annotations={"x": "2"}))


def test_env_fprocess_gpu_settings_and_the_functions_own_token_as_a_file():
    rec = record(
        envProcess="python index.py",
        envVars={"exec_timeout": "30s", "FAAS_GPU_MAX_BATCH": "4"},
        annotations={"com.faas-gpu.slo-ms": "250"},
    )
    p = plan(rec, gpu_env={"FAAS_GPU_SCHEDULER_URL": "http://10.0.0.1:8091"}, token="fn-token")
    assert p.env["fprocess"] == "python index.py"
    assert p.env["exec_timeout"] == "30s" and p.env["FAAS_GPU_MAX_BATCH"] == "4"
    assert p.env["FAAS_GPU_SCHEDULER_URL"] == "http://10.0.0.1:8091"
    # a file in the container, never its env (a function may print its env to anyone)
    assert "FAAS_GPU_TOKEN" not in p.env and "fn-token" not in p.env.values()
    assert p.env["FAAS_GPU_TOKEN_FILE"] == "/var/openfaas/faas-gpu/token" and p.token == "fn-token"
    assert p.env["FAAS_GPU_SLO_MS"] == "250"
    assert p.env["FAAS_GPU_FUNCTION"] == "classify" and p.env["FAAS_GPU_NAMESPACE"] == "openfaas-fn"
    assert p.env["metrics_port"] == "0"  # of-watchdog's fixed 8081 would clash on the host network
    assert "PATH" not in p.env and "HOME" not in p.env  # the host's never reach the image


def test_no_fprocess_leaves_the_images_own_and_no_scheduler_means_no_token():
    p = plan(record(), token="fn-token")
    assert "fprocess" not in p.env and "FAAS_GPU_TOKEN" not in p.env and "FAAS_GPU_TOKEN_FILE" not in p.env
    assert p.token is None
    spec = replica_container(p, replica_id="r", port=1, upstream_port=2, token_source="/t/x")
    assert spec.create_kwargs()["volumes"] == {}


def test_the_token_folder_is_mounted_read_only_beside_the_secrets():
    p = plan(record(secrets=["api-key"]), gpu_env={"FAAS_GPU_SCHEDULER_URL": "http://10.0.0.1:8091"}, token="t")
    spec = replica_container(p, replica_id="r", port=1, upstream_port=2, secrets_source="/s/x", token_source="/t/x")
    assert spec.create_kwargs()["volumes"] == {
        "/s/x": {"bind": SECRETS_PATH, "mode": "ro"},
        "/t/x": {"bind": "/var/openfaas/faas-gpu", "mode": "ro"},
    }


def test_each_replica_gets_its_own_ports_and_an_instances_env_on_top():
    p = plan(record(secrets=["api-key"], envVars={"FAAS_GPU_MAX_BATCH": "8"}))
    inst = InstanceSpec("inst-a", {"FAAS_GPU_MAX_BATCH": "2", "FAAS_GPU_CPU_THREADS": "1"})
    spec = replica_container(
        p, replica_id="classify-inst-a-1", port=31001, upstream_port=31002, instance=inst, secrets_source="/s/x"
    )
    assert spec.env["port"] == "31001" and spec.env["upstream_url"] == "http://127.0.0.1:31002"
    assert spec.env["FAAS_GPU_MAX_BATCH"] == "2" and spec.env["FAAS_GPU_CPU_THREADS"] == "1"
    assert spec.env["HOSTNAME"] == "classify-inst-a-1" and spec.env["bind_address"] == "127.0.0.1"
    assert spec.labels["com.faas-gpu.slot"] == "inst-a" and spec.labels["com.faas-gpu.port"] == "31001"
    kwargs = spec.create_kwargs()
    assert kwargs["network_mode"] == "host"
    assert kwargs["volumes"] == {"/s/x": {"bind": SECRETS_PATH, "mode": "ro"}}
    assert kwargs["name"] == "classify-inst-a-1"


def test_a_function_without_secrets_mounts_nothing():
    spec = replica_container(plan(), replica_id="r", port=1, upstream_port=2, secrets_source="/s/x")
    assert spec.create_kwargs()["volumes"] == {}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("128Mi", 128 * 2**20), ("1G", 10**9), ("1Gi", 2**30), ("512000k", 512_000_000), ("5Mi", MIN_MEMORY_BYTES)],
)
def test_openfaas_memory_quantities(raw, expected):
    assert memory_bytes("limits.memory", raw) == expected


def test_limits_and_requests_become_the_containers_memory_and_cpu():
    r = resources({"memory": "256Mi", "cpu": "500m"}, {"memory": "1Gi", "cpu": "0.25"})
    assert r.mem_limit == 256 * 2**20
    assert r.mem_reservation == 256 * 2**20  # never above the limit (the engine refuses it)
    assert r.nano_cpus == 500_000_000
    assert r.cpu_shares == 256
    kwargs = replica_container(
        plan(record(limits={"memory": "256Mi", "cpu": "2"})), replica_id="r", port=1, upstream_port=2
    ).create_kwargs()
    assert kwargs["mem_limit"] == kwargs["memswap_limit"] == 256 * 2**20  # no swap: over the limit is an OOM kill
    assert kwargs["nano_cpus"] == 2 * 10**9


def test_bad_quantities_are_launch_errors():
    with pytest.raises(LaunchError, match="limits.memory"):
        resources({"memory": "lots"}, None)
    with pytest.raises(LaunchError, match="limits.cpu"):
        resources({"cpu": "0"}, None)


def test_the_digest_changes_with_the_spec_and_with_the_image_behind_the_tag():
    a = plan(record(envVars={"V": "1"}))
    assert a.digest == plan(record(envVars={"V": "1"})).digest
    assert a.digest != plan(record(envVars={"V": "2"})).digest
    assert a.digest != plan(record(envVars={"V": "1"}), image_id="sha256:rebuilt").digest


def test_read_only_root_filesystem_gets_a_writable_tmp():
    kwargs = replica_container(
        plan(record(readOnlyRootFilesystem=True)), replica_id="r", port=1, upstream_port=2
    ).create_kwargs()
    assert kwargs["read_only"] is True and "/tmp" in kwargs["tmpfs"]
