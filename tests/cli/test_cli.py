"""`faas-gpu` CLI: offline commands for real, REST commands against a stub at the HTTP boundary.

The stub answers as OPENFAAS.md §1.1/§1.3/§1.4 say a provider does (202 for writes, 404 for
unknown functions, NDJSON logs) and records every call, so the tests check the exact REST
calls faas-cli would make: methods, paths, query strings, JSON bodies and credentials.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import pytest
import yaml

from faas_gpu import cli
from faas_gpu.paths import TEMPLATES_DIR
from faas_gpu.stack import StackError

STACK = """\
version: 1.0
provider:
  name: openfaas
  gateway: ${GW}
functions:
  echo:
    lang: python3-gpu
    handler: ./echo
    image: me/echo:latest
    annotations: {com.faas-gpu.slo-ms: "100"}
  other:
    skip_build: true
    image: me/other
    namespace: team
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A clean project folder: no stack file, no credentials, no OPENFAAS_* from outside."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENFAAS_CONFIG", str(tmp_path / "ofcfg"))
    monkeypatch.delenv("OPENFAAS_URL", raising=False)
    monkeypatch.delenv("CI", raising=False)
    return tmp_path


@pytest.fixture
def project(env, stub, monkeypatch):
    monkeypatch.setenv("GW", stub.url)
    (env / "echo").mkdir()
    (env / "echo" / "handler.py").write_text("def handle(event, context):\n    return event.body\n")
    (env / "stack.yml").write_text(STACK)
    return env


def run(*argv: str, stdin: bytes = b"", monkeypatch=None) -> int:
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return cli.main(list(argv))


def creds(tmp_path, user="admin", password="s3cret"):
    d = tmp_path / "home" / "secrets"
    d.mkdir(parents=True, exist_ok=True)
    (d / "basic-auth-user").write_text(user + "\n")
    (d / "basic-auth-password").write_text(password + "\n")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- gateway and credentials ---------------------------------------------------------------
def test_gateway_precedence_as_faas_cli(env, monkeypatch, tmp_path):
    from faas_gpu.stack import load_stack

    (tmp_path / "s.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas, gateway: http://Stack:1/}\n"
        "functions: {f: {image: x, skip_build: true}}\n"
    )
    stack = load_stack(tmp_path / "s.yml")
    assert cli.gateway_url("http://Flag:2/", stack) == "http://flag:2"
    assert cli.gateway_url("http://127.0.0.1:8080", stack) == "http://stack:1"  # the default flag does not count
    monkeypatch.setenv("OPENFAAS_URL", "http://env:3")
    assert cli.gateway_url(None, stack) == "http://stack:1"
    (tmp_path / "d.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas, gateway: http://127.0.0.1:8080}\n"
        "functions: {f: {image: x, skip_build: true}}\n"
    )
    default = load_stack(tmp_path / "d.yml")
    assert cli.gateway_url(None, default) == "http://env:3"
    monkeypatch.delenv("OPENFAAS_URL")
    assert cli.gateway_url(None, None) == "http://127.0.0.1:8080"


def test_credentials_from_stack_files_then_faas_cli_config(env, stub, monkeypatch):
    # faas-cli's saved login, in ./.openfaas when CI=true and OPENFAAS_CONFIG is unset
    monkeypatch.delenv("OPENFAAS_CONFIG")
    monkeypatch.setenv("CI", "true")
    token = base64.b64encode(b"admin:from-faas-cli").decode()
    (env / ".openfaas").mkdir()
    (env / ".openfaas" / "config.yml").write_text(
        yaml.safe_dump({"auths": [{"gateway": stub.url + "/", "auth": "basic", "token": token}]})
    )
    assert run("list", "--gateway", stub.url) == 0
    assert stub.calls[-1]["auth"] == f"Basic {token}"
    # the stack's own credential files win over faas-cli's config
    header = creds(env)
    assert run("list", "--gateway", stub.url) == 0
    assert stub.calls[-1]["auth"] == header
    # and flags win over both
    assert run("list", "--gateway", stub.url, "-u", "bob", "-p", "pw") == 0
    assert stub.calls[-1]["auth"] == "Basic " + base64.b64encode(b"bob:pw").decode()


def test_unreachable_gateway_is_one_clear_line(env, capsys):
    assert run("list", "--gateway", "http://127.0.0.1:9") == 1
    err = capsys.readouterr().err
    assert err.startswith("faas-gpu: cannot reach gateway at http://127.0.0.1:9: ") and err.count("\n") == 1


def test_bad_stack_file_is_one_line_without_traceback(env, capsys):
    (env / "stack.yml").write_text("version: 1.0\nprovider: {name: openfaas}\nfunctions: {x: {image: 3, lang: []}}\n")
    assert run("deploy") == 1
    err = capsys.readouterr().err
    assert err == "faas-gpu: stack.yml: functions.x.lang: must be a string\n"
    (env / "stack.yml").write_text("version: 1.0\nprovider: [\n")
    assert run("build") == 1
    assert capsys.readouterr().err.startswith("faas-gpu: stack.yml: line ")


# -- deploy ------------------------------------------------------------------------------
def test_deploy_puts_then_posts_on_404_with_faas_cli_json(project, stub, capsys):
    auth = creds(project)
    assert run("deploy", "--filter", "echo") == 0
    assert stub.only() == [("PUT", "/system/functions"), ("POST", "/system/functions")]
    assert stub.calls[0]["json"] == {
        "service": "echo",
        "image": "me/echo:latest",
        "annotations": {"com.faas-gpu.slo-ms": "100"},
    }
    assert all(c["auth"] == auth for c in stub.calls)
    assert f"URL: {stub.url}/function/echo" in capsys.readouterr().out
    # second deploy: the PUT succeeds (202), no POST
    stub.calls.clear()
    assert run("deploy") == 0
    assert stub.only() == [
        ("PUT", "/system/functions"),
        ("PUT", "/system/functions"),
        ("POST", "/system/functions"),
    ]
    assert stub.calls[1]["json"]["namespace"] == "team"


def test_deploy_replace_deletes_then_posts(project, stub):
    assert run("deploy", "--filter", "other", "--replace") == 0
    assert stub.only() == [("DELETE", "/system/functions"), ("POST", "/system/functions")]
    assert stub.calls[0]["json"] == {"functionName": "other", "namespace": "team"}


@pytest.mark.parametrize("code", [201, 400, 500])
def test_deploy_failure_prints_provider_message_and_exits_1(project, stub, capsys, code):
    stub.answers[("PUT", "/system/functions")] = (code, "image: not in the local image store")
    assert run("deploy", "--filter", "echo") == 1
    err = capsys.readouterr().err
    assert f"deploy echo: unexpected status {code}: image: not in the local image store" in err
    assert "failed to deploy: echo" in err and "Traceback" not in err


def test_deploy_unknown_filter_names_the_file(project, capsys):
    assert run("deploy", "--filter", "nope") == 1
    assert "stack.yml: functions.nope: no such function" in capsys.readouterr().err


# -- list / describe -----------------------------------------------------------------------
def test_list_and_describe(project, stub, capsys):
    assert run("deploy") == 0
    capsys.readouterr()
    stub.calls.clear()
    assert run("list") == 0
    assert stub.calls[-1]["query"] == {}
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["Function", "Invocations", "Replicas"] and out[1].split() == ["echo", "0", "1"]
    assert run("list", "-n", "team", "-v") == 0
    assert stub.calls[-1]["query"] == {"namespace": "team"}
    assert "me/echo:latest" in capsys.readouterr().out

    stub.calls.clear()
    assert run("describe", "echo") == 0
    assert [(c["method"], c["path"], c["query"]) for c in stub.calls] == [
        ("GET", "/system/function/echo", {"usage": "1"}),
        ("GET", "/system/functions", {}),
        ("GET", "/system/function/echo/instances", {}),
    ]
    out = capsys.readouterr().out
    assert "Status:              Ready" in out and "com.faas-gpu.slo-ms: 100" in out
    assert run("describe", "echo", "-n", "team") == 0
    assert stub.calls[-3]["query"] == {"usage": "1", "namespace": "team"}
    assert run("describe", "missing") == 1
    assert "No such function: missing" in capsys.readouterr().err


def test_describe_names_the_replicas_whose_memory_is_not_counted(project, stub, capsys):
    assert run("deploy") == 0
    gap = {"instance": "r1", "node": "worker2", "reason": "node worker2 is down"}  # the Swarm runtime's
    stub.functions["echo"]["usage"] = {"cpu": 0.0, "totalMemoryBytes": 2 * 1024 * 1024, "faasGpuUnmeasured": [gap]}
    capsys.readouterr()
    assert run("describe", "echo") == 0
    out = capsys.readouterr().out
    assert "RAM:                 2.00 MB" in out
    assert "Not measured:        r1 on worker2: node worker2 is down" in out


# -- invoke ------------------------------------------------------------------------------
def test_invoke_posts_stdin_to_function_dot_namespace_without_credentials(project, stub, capsys, monkeypatch):
    creds(project)
    rc = run(
        "invoke", "echo", "-H", "X-Faas-Gpu-Class=best-effort", "--query", "a=1", stdin=b"hi", monkeypatch=monkeypatch
    )
    assert rc == 0
    call = stub.calls[-1]
    assert (call["method"], call["path"], call["query"], call["json"]) == (
        "POST",
        "/function/echo.openfaas-fn",
        {"a": "1"},
        "hi",
    )
    assert call["auth"] is None and call["headers"]["X-Faas-Gpu-Class"] == "best-effort"
    assert capsys.readouterr().out == "echo:hi"
    assert run("invoke", "echo", "-n", "team", "--method", "get", monkeypatch=monkeypatch) == 0
    assert stub.only()[-1] == ("GET", "/function/echo.team")


def test_invoke_async_and_errors(project, stub, capsys, monkeypatch):
    assert run("invoke", "echo", "--async", stdin=b"x", monkeypatch=monkeypatch) == 0
    assert stub.only()[-1] == ("POST", "/async-function/echo.openfaas-fn")
    assert "submitted asynchronously" in capsys.readouterr().err
    stub.answers[("POST", "/function/echo.openfaas-fn")] = (500, "bad things")
    assert run("invoke", "echo", monkeypatch=monkeypatch) == 1
    assert "Server returned unexpected status code: 500 - bad things" in capsys.readouterr().err
    assert run("invoke", "echo", "-H", "novalue", monkeypatch=monkeypatch) == 1


# -- logs --------------------------------------------------------------------------------
def test_logs_query_and_format(project, stub, capsys):
    assert run("logs", "echo", "--no-follow", "--tail", "5", "--since", "5m", "-n", "openfaas-fn") == 0
    q = stub.calls[-1]["query"]
    assert q["name"] == "echo" and q["follow"] == "false" and q["tail"] == "5" and q["namespace"] == "openfaas-fn"
    assert q["since"].endswith("Z") and q["since"][4] == "-"
    assert capsys.readouterr().out == "T1 echo (echo-1) a\nT2 echo (echo-2) b\n"
    assert run("logs", "echo") == 0
    assert stub.calls[-1]["query"]["follow"] == "true" and "since" not in stub.calls[-1]["query"]
    assert run("logs", "echo", "--since", "soon") == 1
    stub.answers[("GET", "/system/logs")] = (501, "")
    assert run("logs", "echo") == 1


def test_logs_of_a_function_that_does_not_exist_say_so(project, stub, capsys):
    """The CE gateway answers /system/logs of an unknown function 501 with an empty body, the same
    as for a provider without logs; the CLI looks the function up to tell which."""
    stub.answers[("GET", "/system/logs")] = (501, "")
    assert run("logs", "nosuch", "--no-follow") == 1
    err = capsys.readouterr().err
    assert "no such function: nosuch" in err and "does not serve logs" not in err
    stub.functions["echo"] = stub._status({"service": "echo", "image": "me/echo:latest"})
    assert run("logs", "echo", "--no-follow") == 1  # it exists: then the logs are what is missing
    assert "the provider does not serve logs (501" in capsys.readouterr().err


def test_go_durations():
    assert cli.parse_go_duration("1h30m") == 5400
    assert cli.parse_go_duration("1.5s") == 1.5 and cli.parse_go_duration("250ms") == 0.25
    assert cli.parse_go_duration("30") == 30


# -- remove ------------------------------------------------------------------------------
def test_remove_by_name_and_by_stack(project, stub, capsys):
    assert run("deploy") == 0
    stub.calls.clear()
    assert run("remove", "echo") == 0
    assert stub.calls[-1]["json"] == {"functionName": "echo"}
    assert run("remove", "echo") == 1
    assert "No existing function to remove: echo" in capsys.readouterr().err
    stub.calls.clear()
    assert run("remove", "-f", "stack.yml", "--filter", "other") == 0
    assert stub.calls[-1]["json"] == {"functionName": "other", "namespace": "team"}


# -- secrets -----------------------------------------------------------------------------
def test_secret_calls(project, stub, capsys, monkeypatch, tmp_path):
    assert run("secret", "create", "api-key", "--from-literal", "v1") == 0
    assert (stub.calls[-1]["method"], stub.calls[-1]["json"]) == ("POST", {"name": "api-key", "value": "v1"})
    (tmp_path / "key.bin").write_bytes(b"\x00\x01")
    assert run("secret", "update", "api-key", "--from-file", str(tmp_path / "key.bin"), "-n", "team") == 0
    assert stub.calls[-1]["method"] == "PUT"
    assert stub.calls[-1]["json"] == {"name": "api-key", "namespace": "team", "rawValue": "AAE="}
    assert run("secret", "create", "from-stdin", stdin=b"piped\n", monkeypatch=monkeypatch) == 0
    assert stub.calls[-1]["json"] == {"name": "from-stdin", "value": "piped"}
    assert run("secret", "list") == 0
    assert "api-key" in capsys.readouterr().out
    assert run("secret", "remove", "api-key") == 0
    assert (stub.calls[-1]["method"], stub.calls[-1]["json"]) == ("DELETE", {"name": "api-key"})
    stub.answers[("DELETE", "/system/secrets")] = (204, "")
    assert run("secret", "remove", "api-key") == 1  # faas-cli: only 200/202
    stub.answers[("POST", "/system/secrets")] = (409, "exists")
    assert run("secret", "create", "api-key", "--from-literal", "v") == 1
    assert "already exists" in capsys.readouterr().err


def test_version_reads_gateway_info(env, stub, capsys):
    assert run("version", "--gateway", stub.url) == 0
    out = capsys.readouterr().out
    assert "faas-gpu" in out and "name: faas-gpu" in out and "version: 0.1.0" in out
    assert run("version", "--gateway", "http://127.0.0.1:9") == 0


# -- offline: template pull, new, build --------------------------------------------------
def test_template_pull_writes_faas_cli_layout_and_meta(env, capsys):
    assert run("template", "pull") == 0
    dest = env / "template" / "python3-gpu"
    want = {
        p.relative_to(TEMPLATES_DIR / "python3-gpu")
        for p in (TEMPLATES_DIR / "python3-gpu").rglob("*")
        if "__pycache__" not in p.parts and ".pytest_cache" not in p.parts
    }
    got = {p.relative_to(dest) for p in dest.rglob("*")}
    assert got == want | {__import__("pathlib").Path("meta.json")}
    meta = json.loads((dest / "meta.json").read_text())
    assert set(meta) == {"repository", "sha", "written_at"} and meta["written_at"].endswith("Z")
    # like faas-cli, an existing template is kept unless --overwrite
    (dest / "template.yml").write_text((dest / "template.yml").read_text() + "# local edit\n")
    assert run("template", "pull") == 0
    assert "# local edit" in (dest / "template.yml").read_text()
    assert run("template", "pull", "python3-gpu", "--overwrite") == 0
    assert "# local edit" not in (dest / "template.yml").read_text()


def test_template_pull_from_a_local_git_repository(env, tmp_path):
    repo = tmp_path / "tpl-repo"
    (repo / "template" / "mylang" / "function").mkdir(parents=True)
    (repo / "template" / "mylang" / "template.yml").write_text("language: mylang\nfprocess: cat\n")
    (repo / "template" / "mylang" / "function" / "handler.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "t"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert run("template", "pull", str(repo)) == 0
    meta = json.loads((env / "template" / "mylang" / "meta.json").read_text())
    assert meta["repository"] == str(repo) and meta["sha"] == sha
    assert (env / "template" / "mylang" / "function" / "handler.py").is_file()
    assert run("template", "pull", str(tmp_path / "no-such-repo")) == 1


def test_new_writes_stack_yaml_handler_and_gitignore(env, capsys):
    (env / ".gitignore").write_text("build\n")
    assert run("new", "my-fn") == 0  # python3-gpu by default
    out = capsys.readouterr().out
    assert "Function created in folder: my-fn" in out and "python3-gpu template" in out
    handler_src = TEMPLATES_DIR / "python3-gpu" / "function"
    assert {p.name for p in (env / "my-fn").iterdir()} == {p.name for p in handler_src.iterdir()} - {"__pycache__"}
    text = (env / "stack.yaml").read_text()
    assert text == (
        "version: 1.0\nprovider:\n  name: openfaas\n  gateway: http://127.0.0.1:8080\nfunctions:\n"
        "  my-fn:\n    lang: python3-gpu\n    handler: ./my-fn\n    image: my-fn:latest\n"
    )
    assert (env / ".gitignore").read_text().split() == ["build", "template", ".secrets"]
    # --append with a prefix keeps what is there (comments included) and adds the function
    (env / "stack.yaml").write_text("# mine\n" + text)
    assert run("new", "second", "--lang", "python3-gpu", "--append", "stack.yaml", "-p", "ghcr.io/me") == 0
    data = yaml.safe_load((env / "stack.yaml").read_text())
    assert data["functions"]["second"] == {
        "lang": "python3-gpu",
        "handler": "./second",
        "image": "ghcr.io/me/second:latest",
    }
    assert (env / "stack.yaml").read_text().startswith("# mine\n")
    from faas_gpu.stack import load_stack

    assert set(load_stack(env / "stack.yaml").functions) == {"my-fn", "second"}
    # errors
    assert run("new", "second", "--append", "stack.yaml") == 1  # exists
    assert run("new", "third") == 1  # stack.yaml exists: --append is needed
    assert run("new", "Bad_Name") == 1
    assert run("new", "fourth", "--lang", "no-such-lang", "--append", "stack.yaml") == 1
    err = capsys.readouterr().err
    assert "template 'no-such-lang' not found" in err and str(TEMPLATES_DIR) in err


def test_new_names_the_stack_file_it_writes(env, capsys):
    """faas-cli 0.18's `new` writes stack.yaml, and so does ours: what it prints says that file,
    never stack.yml."""
    assert run("new", "fn-one") == 0
    out = capsys.readouterr().out
    assert "Stack file written: stack.yaml" in out and "stack.yml" not in out
    assert run("new", "fn-two", "--append", "stack.yaml") == 0
    out = capsys.readouterr().out
    assert "Stack file updated: stack.yaml" in out and "stack.yml" not in out


def test_rollback_deploys_the_previous_version_with_faas_clis_put(project, stub, capsys):
    previous = {"service": "echo", "image": "me/echo:1", "envVars": {"V": "1"}}
    stub.functions["echo"] = {**stub._status({"service": "echo", "image": "me/echo:2"}), "faasGpuPrevious": previous}
    assert run("rollback", "echo") == 0
    put = stub.calls[-1]
    assert (put["method"], put["path"]) == ("PUT", "/system/functions")
    assert put["json"] == previous and "Rolled back echo" in capsys.readouterr().out
    assert "faasGpuPrevious" not in stub.functions["echo"]  # what the stub keeps after the PUT
    assert run("rollback", "echo") == 1
    assert "no earlier version to roll back to" in capsys.readouterr().err
    assert run("rollback", "nosuch") == 1
    assert "no such function: nosuch" in capsys.readouterr().err


def test_new_prefers_the_pulled_template(env):
    assert run("template", "pull") == 0
    marker = env / "template" / "python3-gpu" / "function" / "from-pulled.txt"
    marker.write_text("x")
    assert run("new", "fn") == 0
    assert (env / "fn" / "from-pulled.txt").is_file()


def test_build_shrinkwrap_and_image_via_cli(project, capsys):
    assert run("build", "--shrinkwrap") == 0
    out = capsys.readouterr().out
    assert "echo shrink-wrapped to ./build/echo" in out and "Skipping build of: other." in out
    assert (project / "build" / "echo" / "function" / "handler.py").is_file()
    assert not (project / "home" / "images").exists()
    assert run("build", "--filter", "echo") == 0
    out, err = capsys.readouterr()
    assert "Image: me/echo:latest built." in out
    assert err == ""  # stderr is no terminal here: no progress bar, not even a carriage return
    from faas_gpu.imagestore import ImageStore

    record = ImageStore(project / "home" / "images").get("me/echo")
    assert record is not None and (record.context / "function" / "handler.py").is_file()


def test_build_unknown_lang_is_one_line(env, capsys):
    (env / "f").mkdir()
    (env / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\nfunctions: {f: {lang: cobol, handler: ./f, image: f}}\n"
    )
    assert run("build", "--shrinkwrap") == 1
    err = capsys.readouterr().err
    assert err.startswith("faas-gpu: functions.f.lang: template 'cobol' not found") and err.count("\n") == 1


# -- delegation --------------------------------------------------------------------------
def test_up_and_sim_get_the_rest_of_argv(monkeypatch):
    import faas_gpu.cli.up
    import faas_gpu.sim.cli

    seen = {}
    monkeypatch.setattr(faas_gpu.cli.up, "main", lambda argv: seen.setdefault("up", argv) and 0)
    monkeypatch.setattr(faas_gpu.sim.cli, "main", lambda argv: seen.setdefault("sim", argv) and 3)
    assert cli.main(["up", "-f", "x.yml", "--no-deploy"]) == 0
    assert cli.main(["sim", "scenario.yml", "--policies", "lb"]) == 3
    assert seen == {"up": ["-f", "x.yml", "--no-deploy"], "sim": ["scenario.yml", "--policies", "lb"]}


def test_console_script_entry_point_runs(env):
    proc = subprocess.run([sys.executable, "-m", "faas_gpu.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for word in (
        "build",
        "deploy",
        "list",
        "describe",
        "invoke",
        "logs",
        "remove",
        "secret",
        "new",
        "template",
        "up",
        "sim",
        "version",
    ):
        assert word in proc.stdout


@pytest.mark.parametrize("command", ["build", "up"])
def test_build_and_up_refuse_a_handler_outside_the_stack_folder(env, capsys, command):
    (env / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\n"
        "functions: {f: {lang: python3-gpu, handler: ../../../../etc, image: f}}\n"
    )
    if command == "build":
        assert run("build") == 1
        err = capsys.readouterr().err
    else:  # what `faas-gpu up -f` runs once the daemons serve: the same parser, before any copy
        with pytest.raises(StackError) as exc:
            cli.up_deploy(str(env / "stack.yml"), "http://127.0.0.1:9")
        err = str(exc.value)
    assert "functions.f.handler" in err and "outside the stack file's folder" in err, err
    assert "Traceback" not in err
    assert not (env / "build").exists()
