"""stack.yml as faas-cli reads it; every bad input names the file and the key."""

from __future__ import annotations

import textwrap

import pytest

from faas_gpu.paths import REPO_ROOT
from faas_gpu.stack import StackError, envsubst, find_stack_file, load_stack

GOOD = """
version: 1.0
provider:
  name: openfaas
  gateway: ${GW:-http://127.0.0.1:8080}
functions:
  fn:
    lang: python3-gpu
    handler: ./fn
    image: ${REGISTRY}/fn:latest
    fprocess: python index.py
    environment: {B: two, N: 3}
    environment_file: [env.yml]
    secrets: [api-key]
    labels: {com.openfaas.scale.min: 2}
    annotations: {com.faas-gpu.slo-ms: "100"}
    limits: {memory: 1Gi, cpu: "2"}
    readonly_root_filesystem: true
"""


def write(tmp_path, text, name="stack.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_stack_and_deployment_json(tmp_path):
    (tmp_path / "env.yml").write_text("environment:\n  A: one\n  B: from-file\n")
    stack = load_stack(write(tmp_path, GOOD), env={"REGISTRY": "ghcr.io/me"})
    fn = stack.functions["fn"]
    assert stack.gateway == "http://127.0.0.1:8080"
    assert fn.image == "ghcr.io/me/fn:latest"
    assert fn.environment == {"A": "one", "B": "two", "N": "3"}
    assert fn.to_deployment() == {
        "service": "fn",
        "image": "ghcr.io/me/fn:latest",
        "envProcess": "python index.py",
        "envVars": {"A": "one", "B": "two", "N": "3"},
        "secrets": ["api-key"],
        "labels": {"com.openfaas.scale.min": "2"},
        "annotations": {"com.faas-gpu.slo-ms": "100"},
        "limits": {"memory": "1Gi", "cpu": "2"},
        "readOnlyRootFilesystem": True,
    }


def test_envsubst_forms():
    env = {"A": "x", "EMPTY": ""}
    assert envsubst("${A}-$A-${B:-dflt}-${EMPTY:-e}-${MISSING}", env) == "x-x-dflt-e-"


def test_repo_stack_file_parses():
    stack = load_stack(REPO_ROOT / "stack.yml")
    assert {"echo", "classify", "printenv"} <= set(stack.functions)
    assert stack.functions["printenv"].skip_build


@pytest.mark.parametrize(
    "body, key",
    [
        ("version: 2.0\nprovider: {name: openfaas}\nfunctions: {f: {image: x, skip_build: true}}", "version"),
        ("version: 1.0\nprovider: {name: faasd}\nfunctions: {f: {image: x, skip_build: true}}", "provider.name"),
        ("version: 1.0\nprovider: {name: openfaas}\nfunctions: {}", "functions"),
        ("version: 1.0\nprovider: {name: openfaas}\nfunctions: {Bad_Name: {image: x}}", "functions.Bad_Name"),
        (
            "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {lang: python3-gpu, handler: ./f}}",
            "functions.f.image",
        ),
        ("version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {image: x, handler: ./f}}", "functions.f.lang"),
        (
            "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {image: x, skip_build: true, labels: [a]}}",
            "functions.f.labels",
        ),
        (
            "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {image: x, skip_build: true, colour: red}}",
            "functions.f.colour",
        ),
        (
            "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {image: x, skip_build: true, "
            "limits: {nvidia.com/gpu: 1}}}",
            "functions.f.limits.nvidia.com/gpu",
        ),
        (
            "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {image: x, skip_build: true, "
            "environment_file: [missing.yml]}}",
            "functions.f.environment_file[0]",
        ),
        ("version: 1.0\nprovider: {name: openfaas}\nfunctionz: {}", "functionz"),
        ("version: 1.0\nprovider: [\n", "line"),
    ],
)
def test_bad_stack_names_file_and_key(tmp_path, body, key):
    with pytest.raises(StackError) as err:
        load_stack(write(tmp_path, body, "my-stack.yml"))
    assert str(err.value).startswith(f"my-stack.yml: {key}"), str(err.value)


def test_gpu_limit_error_points_at_the_annotation(tmp_path):
    body = (
        "version: 1.0\nprovider: {name: openfaas}\n"
        "functions: {f: {image: x, skip_build: true, limits: {nvidia.com/gpu: 1}}}"
    )
    with pytest.raises(StackError, match="com.faas-gpu.gpu"):
        load_stack(write(tmp_path, body))


def test_default_stack_file_lookup(tmp_path):
    assert find_stack_file(None, tmp_path) is None
    (tmp_path / "stack.yml").write_text("")
    assert find_stack_file(None, tmp_path).name == "stack.yml"
    (tmp_path / "stack.yaml").write_text("")
    assert find_stack_file(None, tmp_path).name == "stack.yaml"
