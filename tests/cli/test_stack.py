"""stack.yml as faas-cli reads it; every bad input names the file and the key."""

from __future__ import annotations

import textwrap

import pytest

from faas_gpu.paths import REPO_ROOT
from faas_gpu.stack import StackError, StackFile, envsubst, find_stack_file, load_stack

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


def test_envsubst_unset_versus_empty_and_disabled(tmp_path):
    env = {"EMPTY": ""}
    assert envsubst("${EMPTY-unset}|${EMPTY:-empty}|${NOPE-unset}", env) == "|empty|unset"
    body = "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {image: '${IMG}', skip_build: true}}\n"
    path = write(tmp_path, body)
    assert load_stack(path, env={"IMG": "x/y"}).functions["f"].image == "x/y"
    assert load_stack(path, env={"IMG": "x/y"}, substitute=False).functions["f"].image == "${IMG}"
    assert StackFile.load(path, envsubst=False).functions["f"].image == "${IMG}"


def test_environment_file_is_relative_to_the_stack_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.yml").write_text("environment: {A: '1', B: a}\n")
    (tmp_path / "sub" / "b.yml").write_text("environment: {B: b}\n")
    body = (
        "version: 1.0\nprovider: {name: openfaas}\n"
        "functions: {f: {image: x, skip_build: true, environment_file: [a.yml, b.yml], environment: {C: c}}}\n"
    )
    monkeypatch.chdir(tmp_path)  # not the stack file's folder
    fn = load_stack(write(tmp_path / "sub", body)).functions["f"]
    assert fn.environment == {"A": "1", "B": "b", "C": "c"}  # later files win, environment{} wins over files


@pytest.mark.parametrize(
    "content, message",
    [
        ("environment: [a]\n", "a.yml must hold `environment: {KEY: value}`"),
        ("environment: {A: [1]}\n", "functions.f.environment_file[0]:a.yml.environment.A: must be a string"),
        ("environment: {A: 1\n", "functions.f.environment_file[0]: a.yml: line"),
        ("environment: {}\nother: 1\n", "unknown key other"),
    ],
)
def test_environment_file_errors_name_the_key(tmp_path, content, message):
    (tmp_path / "a.yml").write_text(content)
    body = BASE + "functions: {f: {image: x, skip_build: true, environment_file: [a.yml]}}"
    with pytest.raises(StackError) as err:
        load_stack(write(tmp_path, body, "s.yml"))
    assert str(err.value).startswith("s.yml: functions.f.environment_file[0]") and message in str(err.value)


def test_scalars_keep_their_text_and_booleans_parse(tmp_path):
    body = """
    provider: {name: openfaas, gateway: HTTP://GW:8080/}
    functions:
      f:
        image: x
        skip_build: yes
        readonly_root_filesystem: "true"
        labels: {a: 1e3, b: 0x10, c: 010, d: true, e: ~}
        constraints: [node.platform.os == linux]
        build_args: {PY: 3.11}
        build_options: [dev]
        platforms: linux/amd64
        requests: {memory: 128Mi, cpu: 100m}
    configuration:
      templates: [{name: python3-gpu, source: https://example.com/t.git}]
      copy: [common]
    """
    stack = load_stack(write(tmp_path, body))  # no version: faas-cli accepts that too
    fn = stack.functions["f"]
    assert stack.version is None and stack.gateway == "http://gw:8080"
    assert fn.skip_build and fn.readonly_root_filesystem
    assert fn.labels == {"a": "1e3", "b": "0x10", "c": "010", "d": "true", "e": ""}
    assert fn.build_args == {"PY": "3.11"} and fn.build_options == ["dev"] and fn.platforms == "linux/amd64"
    assert stack.templates == [{"name": "python3-gpu", "source": "https://example.com/t.git"}]
    assert stack.copy == ["common"] and fn.copy == ["common"]
    dep = fn.to_deployment()
    assert dep == {
        "service": "f",
        "image": "x",
        "constraints": ["node.platform.os == linux"],
        "labels": {"a": "1e3", "b": "0x10", "c": "010", "d": "true", "e": ""},
        "requests": {"memory": "128Mi", "cpu": "100m"},
        "readOnlyRootFilesystem": True,
    }


def test_to_deployment_field_names_are_faas_providers():
    from faas_gpu.stack import FunctionSpec

    full = FunctionSpec(
        name="f",
        image="i",
        fprocess="python index.py",
        namespace="ns",
        environment={"A": "1"},
        secrets=["s"],
        labels={"l": "1"},
        annotations={"com.faas-gpu.gpu": "1"},
        constraints=["c"],
        limits={"memory": "1Gi"},
        requests={"cpu": "1"},
        readonly_root_filesystem=True,
    ).to_deployment()
    assert list(full) == [
        "service",
        "image",
        "namespace",
        "envProcess",
        "envVars",
        "constraints",
        "secrets",
        "labels",
        "annotations",
        "limits",
        "requests",
        "readOnlyRootFilesystem",
    ]
    assert FunctionSpec(name="f", image="i").to_deployment() == {"service": "f", "image": "i"}


BASE = "version: 1.0\nprovider: {name: openfaas}\n"


@pytest.mark.parametrize(
    "body, prefix",
    [
        (
            BASE + "functions: {f: {image: x, skip_build: true, colour: red, size: 2}}",
            "functions.f: unknown keys colour, size",
        ),
        ("version: 1.0\nprovider: {name: openfaas, port: 1}\nfunctions: {f: {image: x}}", "provider.port: unknown key"),
        (BASE + "configuration: {copy: common}\nfunctions: {f: {image: x, skip_build: true}}", "configuration.copy"),
        (BASE + "configuration: {templates: [{url: x}]}\nfunctions: {}", "configuration.templates[0].url"),
        (BASE + "functions: {f: {image: x, skip_build: maybe}}", "functions.f.skip_build: must be true or false"),
        (BASE + "functions: {f: {image: x, skip_build: true, secrets: [a, [b]]}}", "functions.f.secrets[1]"),
        (BASE + "functions: {f: {image: x, skip_build: true, limits: {disk: 1G}}}", "functions.f.limits.disk"),
        (BASE + "functions: {f: {image: x, skip_build: true, requests: {amd.com/gpu: 1}}}", "functions.f.requests.amd"),
        (BASE + "functions: {f: {image: x, skip_build: true, environment: {A: {B: c}}}}", "functions.f.environment.A"),
        (BASE + "functions: {f: [x]}", "functions.f: must be a mapping"),
        (BASE + "functions:\n  f: {image: x, skip_build: true}\n  f: {image: y, skip_build: true}\n", "line 5"),
        (BASE + "functions: {-bad: {image: x}}", "functions.-bad: invalid function name"),
        ("version: 1.0\nfunctions: {f: {image: x}}", "provider: is required"),
        ("- a\n- b\n", "must be a mapping"),
    ],
)
def test_more_errors_name_file_and_key(tmp_path, body, prefix):
    with pytest.raises(StackError) as err:
        load_stack(write(tmp_path, body, "s.yml"))
    assert str(err.value).startswith(f"s.yml: {prefix}"), str(err.value)


def test_yaml_error_names_the_line(tmp_path):
    body = "version: 1.0\nprovider: {name: openfaas}\nfunctions:\n  f:\n    image: [x\n    lang: y\n"
    with pytest.raises(StackError, match=r"^s.yml: line \d+, column \d+: invalid YAML"):
        load_stack(write(tmp_path, body, "s.yml"))


def test_missing_file_and_filter(tmp_path):
    with pytest.raises(StackError, match="no such file"):
        load_stack(tmp_path / "nope.yml")
    stack = load_stack(write(tmp_path, BASE + "functions: {f: {image: x, skip_build: true}}", "s.yml"))
    assert [s.name for s in stack.select("f")] == ["f"] and len(stack.select()) == 1
    with pytest.raises(StackError, match=r"^s.yml: functions.g: no such function \(have: f\)"):
        stack.select("g")


# -- paths the stack names stay inside its folder ---------------------------------------------
SECRET_LINE = "root:*:19000:0:99999:7:::"


@pytest.mark.parametrize(
    ("fn", "key"),
    [
        ("{lang: python3-gpu, handler: ../../../../etc, image: x}", "functions.f.handler"),
        ("{lang: python3-gpu, handler: /etc, image: x}", "functions.f.handler"),
        ("{image: x, skip_build: true, environment_file: [/etc/passwd]}", "functions.f.environment_file[0]"),
        ("{image: x, skip_build: true, environment_file: [../outside/env.yml]}", "functions.f.environment_file[0]"),
        ("{image: x, skip_build: true, build_secrets: {k: ../outside/env.yml}}", "functions.f.build_secrets.k"),
        ("{lang: ../../etc, handler: ./f, image: x}", "functions.f.lang"),
    ],
)
def test_paths_outside_the_stack_folder_are_refused(tmp_path, fn, key):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "env.yml").write_text(SECRET_LINE + "\n")
    project = tmp_path / "project"
    (project / "f").mkdir(parents=True)
    with pytest.raises(StackError) as err:
        load_stack(write(project, BASE + f"functions: {{f: {fn}}}\n", "s.yml"))
    assert str(err.value).startswith(f"s.yml: {key}:"), str(err.value)
    assert "root:" not in str(err.value) and "19000" not in str(err.value)


def test_configuration_copy_outside_the_stack_folder_is_refused(tmp_path):
    body = BASE + "configuration: {copy: [../../etc]}\nfunctions: {f: {image: x, skip_build: true}}\n"
    with pytest.raises(StackError, match=r"^s.yml: configuration.copy\[0\]: .* outside"):
        load_stack(write(tmp_path, body, "s.yml"))


def test_environment_file_errors_never_quote_a_line_of_the_file(tmp_path):
    (tmp_path / "a.yml").write_text(SECRET_LINE + "\n")  # a copied /etc/shadow inside the project
    body = BASE + "functions: {f: {image: x, skip_build: true, environment_file: [a.yml]}}"
    with pytest.raises(StackError) as err:
        load_stack(write(tmp_path, body, "s.yml"))
    assert str(err.value).startswith("s.yml: functions.f.environment_file[0]")
    assert "root" not in str(err.value) and "19000" not in str(err.value)


def test_handler_inside_the_stack_folder_is_accepted(tmp_path):
    (tmp_path / "fns" / "f").mkdir(parents=True)
    body = BASE + "functions: {f: {lang: python3-gpu, handler: ./fns/f/../f, image: x}}\n"
    assert load_stack(write(tmp_path, body, "s.yml")).functions["f"].handler == "./fns/f/../f"
