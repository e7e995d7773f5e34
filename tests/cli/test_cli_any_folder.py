"""The CLI finds its stack from any folder (issue 15): `up` records the running stack in the
per-user config, the other commands find it through that record when neither $FAAS_GPU_HOME
nor a `.faas-gpu` beside the stack file or in the current folder names one, `down` clears it,
and every failure names the places searched.

The in-process tests drive `faas_gpu.cli.main` against the stub provider (tests/cli/stub_gateway.py); the last
one starts a real stack with `faas-gpu up` and walks README's developer flow (new, build,
deploy, invoke, logs, remove, down) from a folder outside the repository.
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from faas_gpu import cli, running
from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port
from tests.cli.stub_gateway import Stub


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """A project folder outside the repository with no FAAS_GPU_HOME and no OpenFaaS settings."""
    project = tmp_path / "project"
    project.mkdir()
    assert not project.resolve().is_relative_to(REPO_ROOT)
    monkeypatch.chdir(project)
    monkeypatch.delenv("FAAS_GPU_HOME", raising=False)
    monkeypatch.delenv("OPENFAAS_URL", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("OPENFAAS_CONFIG", str(tmp_path / "ofcfg"))
    return project


def _state_folder(path: Path, user: str = "admin", password: str = "s3cret") -> Path:
    """A state folder as a stack leaves it: its credentials, 0600."""
    (path / "secrets").mkdir(parents=True)
    (path / "secrets" / "basic-auth-user").write_text(user + "\n")
    (path / "secrets" / "basic-auth-password").write_text(password + "\n")
    return path


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _stack_file(folder: Path, gateway: str = "http://127.0.0.1:8080") -> Path:
    (folder / "fn").mkdir(exist_ok=True)
    (folder / "fn" / "handler.py").write_text("def handle(event, context):\n    return event.body\n")
    path = folder / "stack.yaml"
    path.write_text(
        f"version: 1.0\nprovider: {{name: openfaas, gateway: {gateway}}}\n"
        "functions: {fn: {lang: python3-gpu, handler: ./fn, image: fn:latest}}\n"
    )
    return path


# -- finding the state folder --------------------------------------------------------------
def test_locate_order_env_then_stack_folder_then_current_folder_then_record(outside, tmp_path, monkeypatch):
    recorded = _state_folder(tmp_path / "repo" / ".faas-gpu")
    running.record_stack(recorded, "http://127.0.0.1:18080")
    monkeypatch.setattr(running, "runs", lambda home: home == recorded)

    found = running.locate()
    assert (found.home, found.how, found.gateway) == (recorded, running.RECORDED, "http://127.0.0.1:18080")
    assert f"{outside / '.faas-gpu'} (absent)" in found.searched

    (outside / ".faas-gpu" / "images").mkdir(parents=True)  # what an older `faas-gpu build` left here
    found = running.locate()
    assert found.home == recorded
    assert f"{outside / '.faas-gpu'} (no stack's credentials in it)" in found.searched

    (outside / ".faas-gpu" / "stack.json").write_text("[]")  # `up` ran here
    assert (running.locate().home, running.locate().how) == (outside / ".faas-gpu", running.IN_CWD)

    beside = _state_folder(tmp_path / "elsewhere" / ".faas-gpu")
    found = running.locate(beside.parent)
    assert (found.home, found.how) == (beside, running.BESIDE_STACK)

    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "explicit"))
    found = running.locate(beside.parent)
    assert (found.home, found.how, found.searched) == (tmp_path / "explicit", running.EXPLICIT, ())


def test_a_stopped_recorded_stack_is_not_used_and_is_named(outside, tmp_path):
    stopped = _state_folder(tmp_path / "old" / ".faas-gpu")
    running.record_stack(stopped, "http://127.0.0.1:18080")  # nothing runs for it
    found = running.locate()
    assert found.home is None
    text = found.describe()
    assert "$FAAS_GPU_HOME (unset)" in text and str(outside / ".faas-gpu") in text
    assert f"{stopped} (recorded in {running.record_file()}, not running)" in text


def test_up_records_newest_first_and_down_forgets(outside, tmp_path, monkeypatch):
    a, b = tmp_path / "a" / ".faas-gpu", tmp_path / "b" / ".faas-gpu"
    monkeypatch.setattr(running, "runs", lambda home: True)
    running.record_stack(a, "http://127.0.0.1:1/")
    path = running.record_stack(b, "http://127.0.0.1:2")
    assert path == running.record_file() == Path(os.environ["FAAS_GPU_CONFIG"]).resolve()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [(r.home, r.gateway) for r in running.read_records()] == [
        (b, "http://127.0.0.1:2"),
        (a, "http://127.0.0.1:1"),
    ]
    running.record_stack(a, "http://127.0.0.1:3")  # up again: one entry per state folder, newest first
    assert [(r.home, r.gateway) for r in running.read_records()] == [
        (a, "http://127.0.0.1:3"),
        (b, "http://127.0.0.1:2"),
    ]
    assert running.forget_stack(a) and not running.forget_stack(a)
    assert [r.home for r in running.read_records()] == [b]
    monkeypatch.setattr(running, "runs", lambda home: False)
    running.record_stack(a, "http://127.0.0.1:4")  # a stack that stopped without `down` goes
    assert [r.home for r in running.read_records()] == [a]


def test_config_file_follows_xdg_unless_faas_gpu_config(monkeypatch, tmp_path):
    from faas_gpu import paths

    monkeypatch.delenv("FAAS_GPU_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert paths.config_file() == tmp_path / "xdg" / "faas-gpu" / "config.yml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative")  # the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.config_file() == tmp_path / "home" / ".config" / "faas-gpu" / "config.yml"


def test_faas_gpu_config_names_the_file_itself_and_an_old_folder_value_still_reads(monkeypatch, tmp_path, capsys):
    """$FAAS_GPU_CONFIG names the config file, as its name says (before: the folder holding it)."""
    mine = tmp_path / "mine.yml"
    monkeypatch.setenv("FAAS_GPU_CONFIG", str(mine))
    monkeypatch.setattr(running, "runs", lambda home: True)
    written = running.record_stack(tmp_path / "a" / ".faas-gpu", "http://127.0.0.1:1")
    assert written == mine and mine.is_file() and "http://127.0.0.1:1" in mine.read_text()
    assert capsys.readouterr().err == ""
    folder = tmp_path / "old-style"
    folder.mkdir()
    monkeypatch.setenv("FAAS_GPU_CONFIG", str(folder))
    assert running.record_stack(tmp_path / "b" / ".faas-gpu", "http://127.0.0.1:2") == folder / "config.yml"
    err = capsys.readouterr().err
    assert "FAAS_GPU_CONFIG names a file now" in err and str(folder / "config.yml") in err


# -- commands outside the repository, against the stub ---------------------------------------
def test_build_and_deploy_outside_use_the_recorded_stack(outside, tmp_path, stub, monkeypatch, capsys):
    home = _state_folder(tmp_path / "repo" / ".faas-gpu")
    running.record_stack(home, stub.url)
    monkeypatch.setattr(running, "runs", lambda h: h == home)
    _stack_file(outside)  # gateway: the default, as `faas-gpu new` writes it

    assert cli.main(["build"]) == 0
    out = capsys.readouterr().out
    assert f"Image store: {home / 'images'} (the stack of {home} ({running.RECORDED}))" in out
    from faas_gpu.imagestore import ImageStore

    assert ImageStore(home / "images").get("fn:latest") is not None
    assert not (outside / ".faas-gpu").exists()  # nothing lands in the project folder

    assert cli.main(["deploy"]) == 0  # the recorded gateway, with the recorded stack's credentials
    put = stub.calls[-1]
    assert (put["method"], put["path"], put["auth"]) == ("POST", "/system/functions", _basic("admin", "s3cret"))

    assert cli.main(["list"]) == 0 and stub.calls[-1]["auth"] == _basic("admin", "s3cret")


def test_recorded_credentials_go_only_to_the_recorded_gateway(outside, tmp_path, stub, monkeypatch, capsys):
    home = _state_folder(tmp_path / "repo" / ".faas-gpu")
    other = Stub()
    try:
        running.record_stack(home, other.url.replace("127.0.0.1", "localhost"))  # loopback names are one host
        monkeypatch.setattr(running, "runs", lambda h: h == home)
        assert cli.main(["list"]) == 0 and other.calls[-1]["auth"] == _basic("admin", "s3cret")
        monkeypatch.setenv("OPENFAAS_URL", stub.url)  # another gateway: not the recorded stack's password
        stub.answers[("GET", "/system/functions")] = (401, "unauthorized")
        assert cli.main(["list"]) == 1
        assert stub.calls[-1]["auth"] is None
        err = capsys.readouterr().err
        assert "unauthorized (401); no credentials were sent" in err and str(home) in err
    finally:
        other.stop()


def test_without_a_stack_build_and_deploy_name_the_places_searched(outside, capsys):
    _stack_file(outside, gateway=f"http://127.0.0.1:{free_port()}")
    (outside / ".faas-gpu" / "images").mkdir(parents=True)  # an older build's leftovers do not count
    record = running.record_file()
    for argv in (["build"], ["deploy"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        for place in (
            "$FAAS_GPU_HOME (unset)",
            f"{outside / '.faas-gpu'} (no stack's credentials in it)",
            f"{record} (no stack recorded)",
        ):
            assert place in err, err
        assert "start one with `faas-gpu up`" in err, err
    assert "Connection refused (no faas-gpu stack found" in err, err  # deploy: the gateway did not answer


def test_a_401_names_the_credentials_and_the_stack(outside, tmp_path, stub, capsys, monkeypatch):
    home = _state_folder(tmp_path / "here" / ".faas-gpu")
    monkeypatch.setenv("FAAS_GPU_HOME", str(home))
    stub.answers[("PUT", "/system/functions")] = (401, "unauthorized")
    _stack_file(outside, gateway=stub.url)
    assert cli.main(["deploy"]) == 1
    err = capsys.readouterr().err
    assert f"unauthorized (401); the credentials sent came from {home}/secrets/basic-auth-*" in err
    assert "$FAAS_GPU_HOME" in err


def test_deploy_of_an_unbuilt_image_names_the_store_build_fills(outside, tmp_path, stub, capsys, monkeypatch):
    home = _state_folder(tmp_path / "here" / ".faas-gpu")
    monkeypatch.setenv("FAAS_GPU_HOME", str(home))
    stub.answers[("PUT", "/system/functions")] = (400, "image: 'fn:latest' is not in the local image store")
    _stack_file(outside, gateway=stub.url)
    assert cli.main(["deploy"]) == 1
    assert f"`faas-gpu build` from here builds into {home / 'images'}" in capsys.readouterr().err


# -- logs follow by default, as faas-cli ----------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "follow"),
    [([], "true"), (["--follow"], "true"), (["--no-follow"], "false"), (["--follow=false"], "false"),
     (["--follow=0"], "false"), (["--follow=true"], "true")],
)  # fmt: skip
def test_logs_follow_by_default(outside, stub, flags, follow, capsys):
    assert cli.main(["logs", *flags, "echo", "--gateway", stub.url]) == 0
    assert stub.calls[-1]["query"]["follow"] == follow
    assert "a" in capsys.readouterr().out


# -- README's developer flow, outside the repository, against a real stack ------------------
def _cli(cwd: Path, *argv: str, env: dict, stdin: bytes = b"", timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", *argv],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        timeout=timeout_s,
    )


def test_readme_flow_from_a_folder_outside_the_repository(tmp_path):
    """`faas-gpu up` where the stack lives, then new → build → deploy → invoke → logs → remove →
    down from another folder, with no FAAS_GPU_HOME and no --gateway anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("FAAS_GPU_HOME", "OPENFAAS_URL", "CI")}
    env["OPENFAAS_CONFIG"] = str(tmp_path / "ofcfg")
    where_up_ran, project = tmp_path / "checkout", tmp_path / "myproject"
    where_up_ran.mkdir()
    project.mkdir()
    assert not project.resolve().is_relative_to(REPO_ROOT)
    home = (where_up_ran / ".faas-gpu").resolve()
    gateway_port = free_port()
    gateway = f"http://127.0.0.1:{gateway_port}"

    def ok(proc: subprocess.CompletedProcess) -> str:
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
        return proc.stdout.decode()

    up = ok(
        _cli(
            where_up_ran, "up", "--no-gpu", "--no-deploy",
            "--gateway-port", str(gateway_port), "--provider-port", str(free_port()),
            env=env,
        )
    )  # fmt: skip
    try:
        assert f"recorded in:  {running.record_file()}" in up
        ok(_cli(project, "new", "hello", env=env))
        built = ok(_cli(project, "build", env=env))
        assert f"Image store: {home / 'images'}" in built and "Image: hello:latest built." in built
        assert not (project / ".faas-gpu").exists()
        deployed = ok(_cli(project, "deploy", env=env))
        assert f"URL: {gateway}/function/hello" in deployed
        auth = tuple((home / "secrets" / f"basic-auth-{k}").read_text().strip() for k in ("user", "password"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = requests.get(f"{gateway}/system/function/hello", auth=auth, timeout=5)
            if r.status_code == 200 and r.json().get("availableReplicas"):
                break
            time.sleep(0.2)
        answer = yaml.safe_load(ok(_cli(project, "invoke", "hello", env=env, stdin=b"hi there")))
        assert answer == {"message": "Hello from python3-gpu", "bytes": 8}
        assert "hello" in ok(_cli(project, "list", env=env))
        ok(_cli(project, "logs", "hello", "--no-follow", env=env, timeout_s=30))
        assert "Removing old function." in ok(_cli(project, "remove", "hello", env=env))
    finally:
        down = _cli(project, "down", env=env)  # from the project folder too
    assert "faas-gpu stopped" in ok(down) and str(home) in down.stdout.decode()
    assert running.read_records() == []

    again = _cli(project, "deploy", env=env)  # nothing runs now: the error says where it looked
    err = again.stderr.decode()
    assert again.returncode == 1 and f"{running.record_file()} (no stack recorded)" in err, err
