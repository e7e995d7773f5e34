"""`faas-gpu up` does only what changed: a function whose handler, template and requirements did not
change is not built again (the image store keeps the content hash of its build inputs), so an
unchanged stack starts with no pip run and no network; and one function's failed build is reported
while the others deploy. Real builds into a real image store (real pip, from a local wheel, with
the index forbidden), against the stub gateway."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from faas_gpu import imagestore
from faas_gpu.cli.up import UpIncomplete, up_deploy
from faas_gpu.imagestore import ImageStore

PACKAGE, VERSION = "faasgpu_uptest", "1.0"


def _wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, so pip installs a requirement with no index at all."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{PACKAGE}-{VERSION}.dist-info"
    files = {
        f"{PACKAGE}.py": b"VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{PACKAGE}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
    return path


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """pip may reach no index (PIP_NO_INDEX, and an index URL nothing listens on); the wheels it
    may install are in ./wheels (PIP_FIND_LINKS)."""
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENFAAS_CONFIG", str(tmp_path / "ofcfg"))
    monkeypatch.delenv("OPENFAAS_URL", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


HANDLER = "def handle(event, context):\n    return 'x'\n"


def _function(root: Path, name: str, requirements: str = "", handler: str = HANDLER):
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "handler.py").write_text(handler)
    (root / name / "requirements.txt").write_text(requirements)


def _stack(root: Path, *names: str) -> Path:
    lines = [f"  {n}: {{lang: python3-gpu, handler: ./{n}, image: me/{n}:latest}}" for n in names]
    (root / "stack.yml").write_text("version: 1.0\nprovider: {name: openfaas}\nfunctions:\n" + "\n".join(lines) + "\n")
    return root / "stack.yml"


def _no_build(monkeypatch) -> None:
    """Making an environment or running pip now fails the test: nothing may be built."""

    def forbidden(*args, **kwargs):
        raise AssertionError(f"a build step ran: {args[:2]}")

    monkeypatch.setattr(imagestore, "pip_install", forbidden)
    monkeypatch.setattr(imagestore, "make_function_env", forbidden)


def test_up_on_an_unchanged_stack_builds_nothing_and_runs_no_pip_offline(offline, stub, monkeypatch, capsys):
    _wheel(offline / "wheels")
    _function(offline, "fn", requirements=f"{PACKAGE}=={VERSION}\n")
    stack = _stack(offline, "fn")
    assert up_deploy(str(stack), stub.url, progress=False) == ["fn"]
    store = ImageStore(offline / "home" / "images")
    first = store.get("me/fn")
    assert first is not None and first.inputs and any((first.folder / "venv").rglob(f"{PACKAGE}.py"))
    capsys.readouterr()
    # the wheels are gone and nothing may build: an unchanged stack still comes up
    (offline / "wheels" / f"{PACKAGE}-{VERSION}-py3-none-any.whl").unlink()
    with monkeypatch.context() as m:
        _no_build(m)
        assert up_deploy(str(stack), stub.url, progress=False) == ["fn"]
    assert store.get("me/fn").folder == first.folder
    assert "me/fn:latest is up to date" in capsys.readouterr().out
    assert [c["method"] for c in stub.calls if c["path"] == "/system/functions"].count("PUT") == 2  # deployed again
    # a changed handler is built again (its requirement from the wheels, back again)
    _wheel(offline / "wheels")
    _function(offline, "fn", requirements=f"{PACKAGE}=={VERSION}\n", handler=HANDLER.replace("'x'", "'y'"))
    assert up_deploy(str(stack), stub.url, progress=False) == ["fn"]
    second = store.get("me/fn")
    assert second.folder != first.folder and second.inputs != first.inputs
    # and so is one whose requirements changed, even when its handler did not
    (offline / "fn" / "requirements.txt").write_text(f"{PACKAGE}>={VERSION}\n")
    up_deploy(str(stack), stub.url, progress=False)
    assert store.get("me/fn").inputs != second.inputs


def test_one_functions_failed_build_is_reported_and_the_others_deploy(offline, stub, capsys):
    _function(offline, "good")
    _function(offline, "bad", requirements="this-package-is-on-no-index-faas-gpu==0.0.1\n")
    _function(offline, "also-good")
    stack = _stack(offline, "good", "bad", "also-good")
    with pytest.raises(UpIncomplete) as failed:
        up_deploy(str(stack), stub.url, progress=False)
    assert failed.value.deployed == ["good", "also-good"]
    assert failed.value.failures == ["bad's build failed"]
    assert sorted(stub.functions) == ["also-good", "good"]
    err = capsys.readouterr().err
    assert "bad not deployed: its build failed" in err and "pip install" in err


def test_up_says_what_serves_and_exits_1_naming_what_did_not(offline, monkeypatch, capsys):
    """The daemons are up and some functions deployed: `up` prints the stack as it serves, then
    fails naming the rest (before: the first failed build ended `up` with nothing deployed)."""
    from faas_gpu import running
    from faas_gpu.cli import up

    monkeypatch.setattr(up, "start_stack", lambda home, daemons: {"faas-gpu": 4242})
    monkeypatch.setattr(running, "record_stack", lambda home, gateway, provider="": offline / "config.yml")

    def incomplete(*args, **kwargs):
        raise UpIncomplete(["good"], ["bad's build failed"])

    monkeypatch.setattr(up, "up_deploy", incomplete)
    assert up.main(["--no-gpu", "--gateway-port", "18080"]) == 1
    out, err = capsys.readouterr()
    assert "function:     http://127.0.0.1:18080/function/good" in out and "faas-gpu is serving" in out
    assert "the stack serves, but not every function: bad's build failed" in err
