"""Deploy-time validation (provider/validation.py): each rule on its own, no processes.

The HTTP answers these rules give (400 naming the field) are in tests/provider/test_bad_input.py.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from faas_gpu.contract.labels import NODE_LABELS, RUNTIME_LABELS
from faas_gpu.policies.protean.classes import MAX_SLO_MS, parse_slo_ms
from provider.types import FunctionDeployment
from provider.validation import (
    ANNOTATIONS,
    MAX_ENV_ENTRY_BYTES,
    MAX_REPLICAS,
    ValidationError,
    clamp_replicas,
    parse_quantity,
)


def dep(**extra) -> FunctionDeployment:
    return FunctionDeployment.from_json({"service": "fn", "image": "img", "envProcess": "cat", **extra})


def refused(field: str, **extra) -> str:
    with pytest.raises(ValidationError) as err:
        dep(**extra)
    assert str(err.value).startswith(field), str(err.value)
    return str(err.value)


def test_service_name_is_an_rfc1123_label_of_at_most_63_characters():
    assert dep(service="a" * 63).service == "a" * 63
    assert "at most 63" in refused("service:", service="a" * 64)
    refused("service:", service="a" * 300)
    refused("service:", service="-a")
    refused("namespace:", namespace="n" * 64)


@pytest.mark.parametrize("raw", ["abc", "-5", "0", "NaN", "nan", "20O", "inf", "-inf", "1e23", ""])
def test_slo_annotation_must_be_a_sane_number_of_milliseconds(raw):
    refused("annotations: com.faas-gpu.slo-ms", annotations={"com.faas-gpu.slo-ms": raw})


def test_good_faas_gpu_annotations_are_accepted():
    ok = {
        "com.faas-gpu.slo-ms": "100",
        "com.faas-gpu.max-batch": "8",
        "com.faas-gpu.batch-timeout-ms": "0",
        "com.faas-gpu.class": "best-effort",
        "com.faas-gpu.model": "resnet-mini",
        "com.faas-gpu.keep-alive": "fixed:5m",
        "com.faas-gpu.scale-zero": "true",
        "com.faas-gpu.best-effort": "0",
        "com.faas-gpu.gpu": "1",
        "com.faas-gpu.input-shape": "3,32,32",
        "com.faas-gpu.input-dtype": "int64",
        "com.faas-gpu.model-source": "model.py:make",
        "com.faas-gpu.protean-model": "ResNet50",
    }
    assert dep(annotations=ok).annotations == ok
    assert dep(annotations={"com.faas-gpu.apps": "search=500,feed=800", "com.faas-gpu.scaling": "HarmonyBatch"})


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("com.faas-gpu.max-batch", "0"),
        ("com.faas-gpu.max-batch", "8.5"),
        ("com.faas-gpu.max-batch", "99999999999999999999999"),
        ("com.faas-gpu.batch-timeout-ms", "-1"),
        ("com.faas-gpu.class", "urgent"),
        ("com.faas-gpu.model", "../../etc/passwd"),
        ("com.faas-gpu.keep-alive", "forever"),
        ("com.faas-gpu.scale-zero", "yes please"),
        ("com.faas-gpu.scaling", "magic"),
        ("com.faas-gpu.apps", "search"),
        ("com.faas-gpu.apps", "a=100,a=200"),
        ("com.faas-gpu.apps", "a=1e23"),
        ("com.faas-gpu.harmony-strategy", "best"),
        ("com.faas-gpu.gpu", "-1"),
        ("com.faas-gpu.input-shape", "3,x"),
        ("com.faas-gpu.input-dtype", "float128"),
        ("com.faas-gpu.slo_ms", "100"),  # a typo is an unknown key, not silently ignored
    ],
)
def test_every_faas_gpu_annotation_is_checked_naming_it(key, raw):
    message = refused(f"annotations: {key}", annotations={key: raw})
    assert len(message) < 2000


def test_the_table_covers_every_key_the_code_reads():
    import subprocess

    from faas_gpu.paths import REPO_ROOT

    out = subprocess.run(
        ["grep", "-rhoE", r"com\.faas-gpu\.[a-z][a-z-]*[a-z]", "provider", "faas_gpu", "scheduler", "templates"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # the runtimes' own labels on containers and services, and the operator's on Swarm nodes, share
    # the prefix; a deployment may set none
    assert set(out) - set(ANNOTATIONS) - RUNTIME_LABELS - NODE_LABELS == set()
    assert not (RUNTIME_LABELS | NODE_LABELS) & set(ANNOTATIONS)


def test_faas_gpu_keys_in_labels_follow_the_same_rules():
    refused("labels: com.faas-gpu.slo-ms", labels={"com.faas-gpu.slo-ms": "abc"})


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"com.openfaas.scale.max": "1000000000"}, "labels: com.openfaas.scale.max"),
        ({"com.openfaas.scale.max": str(MAX_REPLICAS + 1)}, "labels: com.openfaas.scale.max"),
        ({"com.openfaas.scale.min": "-1"}, "labels: com.openfaas.scale.min"),
        ({"com.openfaas.scale.min": "two"}, "labels: com.openfaas.scale.min"),
        ({"com.openfaas.scale.factor": "101"}, "labels: com.openfaas.scale.factor"),
        ({"com.openfaas.scale.min": "5", "com.openfaas.scale.max": "2"}, "labels: com.openfaas.scale.min"),
        ({"com.openfaas.scale.zero": "yes"}, "labels: com.openfaas.scale.zero"),
        (
            {"com.openfaas.scale.zero": "true", "com.openfaas.scale.zero-duration": "soon"},
            "labels: com.openfaas.scale.zero-duration",
        ),
        (
            {"com.openfaas.scale.zero": "true", "com.openfaas.scale.zero-duration": "0s"},
            "labels: com.openfaas.scale.zero-duration",
        ),
        (
            {"com.openfaas.scale.zero": "true", "com.openfaas.scale.zero-duration": "9000h"},
            "labels: com.openfaas.scale.zero-duration",
        ),
        ({"com.openfaas.scale.target": "50"}, "labels: com.openfaas.scale.target"),
        ({"com.openfaas.scale.type": "rps"}, "labels: com.openfaas.scale.type"),
    ],
)
def test_openfaas_scale_labels_have_types_and_a_cap(labels, field):
    refused(field, labels=labels)


def test_openfaas_pro_scale_to_zero_labels_are_accepted_and_read():
    from provider.validation import zero_after_s

    on = dep(labels={"com.openfaas.scale.zero": "true", "com.openfaas.scale.zero-duration": "1m30s"})
    assert zero_after_s(on.labels) == 90.0
    assert zero_after_s(dep(labels={"com.openfaas.scale.zero": "true"}).labels) == 15 * 60  # Pro's default
    assert zero_after_s(dep(labels={"com.openfaas.scale.zero": "false"}).labels) is None
    assert zero_after_s(dep().labels) is None


def test_scale_min_0_is_read_as_faas_netes_reads_it():
    """faas-netes' getMinReplicaCount ignores a minimum below 1: the function deploys with, and
    wakes to, the default minimum of 1 (going to zero is com.openfaas.scale.zero)."""
    assert dep(labels={"com.openfaas.scale.min": "0", "com.openfaas.scale.max": "3"}).scale_bounds() == (1, 3)


def test_scale_max_up_to_the_cap_is_accepted():
    assert dep(labels={"com.openfaas.scale.max": str(MAX_REPLICAS)}).scale_bounds() == (1, MAX_REPLICAS)


@pytest.mark.parametrize(
    ("raw", "value"),
    [("128Mi", 128 * 2**20), ("1Gi", 2**30), ("500m", Decimal("0.5")), ("2", 2), ("1e3", 1000), ("1.5G", 1.5e9)],
)
def test_kubernetes_quantities_parse(raw, value):
    assert parse_quantity("limits.memory", raw) == Decimal(str(value))


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("limits.memory", {"memory": "lots"}),
        ("limits.memory", {"memory": "-1Gi"}),
        ("limits.cpu", {"cpu": "1e999999"}),
        ("limits.nvidia.com/gpu", {"nvidia.com/gpu": "0.5"}),
        ("limits:", {"disk": "1Gi"}),
    ],
)
def test_limits_are_kubernetes_quantities(field, values):
    refused(field, limits=values)
    refused(field.replace("limits", "requests"), requests=values)


def test_environment_stays_well_below_arg_max():
    assert "envProcess:" in refused("envProcess:", envProcess="x" * (3 * 1024 * 1024))
    refused("envVars.BIG", envVars={"BIG": "x" * MAX_ENV_ENTRY_BYTES})
    refused("envVars:", envVars={f"V{i}": "x" * 60_000 for i in range(6)})
    refused("envVars.", envVars={"A=B": "1"})
    refused("envVars.A", envVars={"A": "nul\0byte"})
    refused("envProcess:", envProcess="cat\0")
    refused("envVars.FAAS_GPU_SLO_MS", envVars={"FAAS_GPU_SLO_MS": "abc"})
    refused("envVars.write_timeout", envVars={"write_timeout": "soon"})


def test_secret_names_are_bounded():
    assert dep(secrets=["s" * 253]).secrets == ["s" * 253]
    refused("secrets:", secrets=["s" * 300])
    refused("secrets:", secrets=["../x"])


def test_a_request_above_the_maximum_is_clamped_and_says_so():
    assert clamp_replicas(5, (1, 20)) == (5, None)
    n, message = clamp_replicas(10**9, (1, 20))
    assert n == 20 and "com.openfaas.scale.max (20)" in message and "scaled to 20" in message
    assert clamp_replicas(1, (2, 3))[0] == 2


@pytest.mark.parametrize("raw", ["1e23", str(MAX_SLO_MS * 2), "inf"])
def test_slo_header_is_bounded(raw):
    with pytest.raises(ValueError, match="X-Faas-Gpu-Slo-Ms"):
        parse_slo_ms(raw)
    assert parse_slo_ms(str(MAX_SLO_MS)) == MAX_SLO_MS


@pytest.mark.parametrize("key", sorted(RUNTIME_LABELS | NODE_LABELS))
def test_a_deployment_cannot_set_a_runtime_label(key):
    """A function labelled as another provider's replica would be adopted or removed by it."""
    refused(f"labels: {key}", labels={key: "x"})
