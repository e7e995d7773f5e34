"""Shrinkwrap exactly like faas-cli; images reuse the stack's packages instead of copying them."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from faas_gpu.build import build, shrinkwrap
from faas_gpu.cli.build import BuildProgress
from faas_gpu.imagestore import BuildError, ImageStore, normalise
from faas_gpu.paths import TEMPLATES_DIR
from faas_gpu.stack import load_stack


@pytest.fixture
def project(tmp_path):
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "handler.py").write_text("def handle(event, context):\n    return 'x'\n")
    (tmp_path / "fn" / "requirements.txt").write_text("requests\n")
    (tmp_path / "fn" / "build").mkdir()  # skipped, as faas-cli skips it
    (tmp_path / "fn" / "template").mkdir()
    (tmp_path / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\n"
        "functions:\n  fn: {lang: python3-gpu, handler: ./fn, image: me/fn}\n"
        "  other: {lang: no-such-lang, handler: ./fn, image: me/other}\n"
    )
    return load_stack(tmp_path / "stack.yml")


def test_shrinkwrap_layout_matches_faas_cli(project, tmp_path):
    out = shrinkwrap(project.functions["fn"])
    assert out == tmp_path / "build" / "fn"
    template = TEMPLATES_DIR / "python3-gpu"
    template_files = {p.relative_to(template) for p in template.glob("*") if p.name != "__pycache__"}
    assert {p.relative_to(out) for p in out.glob("*")} == template_files
    # the handler is overlaid on the template's function folder, whose other files stay
    template_fn = {p.name for p in (template / "function").iterdir() if p.name != "__pycache__"}
    assert {p.name for p in (out / "function").iterdir()} == template_fn | {"handler.py", "requirements.txt"}
    assert "return 'x'" in (out / "function" / "handler.py").read_text()
    assert (out / "function" / "requirements.txt").read_text() == "requests\n"


def test_unknown_lang_is_a_clear_error(project):
    with pytest.raises(BuildError) as err:
        shrinkwrap(project.functions["other"])
    message = str(err.value)
    assert message.startswith("functions.other.lang: template 'no-such-lang' not found")
    assert str(TEMPLATES_DIR / "no-such-lang") in message and "template/no-such-lang" in message


def test_image_env_reuses_stack_packages(project, tmp_path):
    store = ImageStore(tmp_path / "images")
    record = build(project.functions["fn"], store)
    assert record.image == "me/fn:latest" and store.get("me/fn") == record
    assert record.fprocess == "python index.py"
    # torch and flask come from the stack's environment through the .pth file, not a copy
    proc = subprocess.run(
        [str(record.python), "-c", "import torch, flask, requests; print(torch.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(record.folder) not in proc.stdout
    # its own files only: bin/python links to the interpreter (a static one, as Debian's, is ~7 MB)
    size = sum(f.stat().st_size for f in (record.folder / "venv").rglob("*") if f.is_file() and not f.is_symlink())
    assert size < 5_000_000
    # requests (in function/requirements.txt) was already satisfied: pip installed nothing
    site = next((record.folder / "venv").glob("lib/python*/site-packages"))
    assert sorted(p.name for p in site.iterdir()) == ["_faas_gpu_stack.pth"]
    # a rebuild replaces the image atomically
    again = build(project.functions["fn"], store)
    assert again.created >= record.created and len(store.list()) == 1


def test_failed_requirements_leave_no_half_image(project, tmp_path):
    (tmp_path / "fn" / "requirements.txt").write_text("this-package-does-not-exist-faas-gpu==0.0.0\n")
    store = ImageStore(tmp_path / "images")
    with pytest.raises(BuildError, match="pip install"):
        build(project.functions["fn"], store)
    assert store.get("me/fn") is None
    assert [p.name for p in (tmp_path / "images").iterdir()] == []


def test_image_names_normalise_like_docker():
    assert normalise("me/fn") == "me/fn:latest"
    assert normalise("localhost:5000/fn") == "localhost:5000/fn:latest"
    assert normalise("fn:1.0") == "fn:1.0"


def test_cli_build_runs_offline(project, tmp_path, monkeypatch):
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", "build", "-f", str(tmp_path / "stack.yml"), "--filter", "fn"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert ImageStore(tmp_path / "home" / "images").get("me/fn") is not None


def test_store_publishes_atomically_and_keeps_the_previous_version(project, tmp_path):
    store = ImageStore(tmp_path / "images")
    ctx = shrinkwrap(project.functions["fn"])
    first = store.add("me/fn", ctx, lang="python3-gpu", fprocess="python index.py")
    link = tmp_path / "images" / "me_fn_latest"
    assert link.is_symlink() and link.resolve() == first.folder
    second = store.add("me/fn:latest", ctx, lang="python3-gpu", fprocess="python index.py")
    assert store.get("me/fn") == second and first.folder.is_dir()  # a running instance keeps its folder
    third = store.add("me/fn", ctx, lang="python3-gpu", fprocess="python index.py")
    assert not first.folder.exists() and second.folder.is_dir() and third.folder.is_dir()
    assert [r.image for r in store.list()] == ["me/fn:latest"]
    assert not [p for p in (tmp_path / "images").iterdir() if p.name.startswith(".tmp-")]
    assert store.remove("me/fn") and store.get("me/fn") is None and store.list() == []
    assert list((tmp_path / "images").iterdir()) == [] and not store.remove("me/fn")


def test_folder_names_are_safe():
    from faas_gpu.imagestore import folder_name

    assert folder_name("ghcr.io/me/fn:1.0") == "ghcr.io_me_fn_1.0"
    assert folder_name("../../etc") == "_.._etc_latest"
    with pytest.raises(BuildError):
        normalise("  ")


def test_pulled_template_wins_and_copy_paths_are_added(tmp_path):
    import shutil

    shutil.copytree(TEMPLATES_DIR / "python3-gpu", tmp_path / "template" / "python3-gpu")
    (tmp_path / "template" / "python3-gpu" / "pulled.txt").write_text("mine")
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "handler.py").write_text("x = 1\n")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "util.py").write_text("y = 2\n")
    (tmp_path / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\nconfiguration: {copy: [common]}\n"
        "functions:\n  fn: {lang: python3-gpu, handler: ./fn, image: me/fn}\n"
    )
    spec = load_stack(tmp_path / "stack.yml").functions["fn"]
    out = shrinkwrap(spec, tmp_path, "out")
    assert out == tmp_path / "out" / "fn"
    assert (out / "pulled.txt").read_text() == "mine"
    assert (out / "function" / "common" / "util.py").read_text() == "y = 2\n"


def test_dockerfile_lang_is_the_handler_folder(tmp_path):
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\nfunctions:\n  fn: {lang: Dockerfile, handler: ./fn, image: me/fn}\n"
    )
    spec = load_stack(tmp_path / "stack.yml").functions["fn"]
    out = shrinkwrap(spec)
    assert sorted(p.name for p in out.iterdir()) == ["Dockerfile"]
    with pytest.raises(BuildError, match="dockerfile functions cannot be built"):
        build(spec, ImageStore(tmp_path / "images"))


def test_a_link_in_the_handler_folder_to_outside_the_project_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("do not copy\n")
    project = tmp_path / "project"
    (project / "fn").mkdir(parents=True)
    (project / "fn" / "handler.py").write_text("def handle(event, context):\n    return 'x'\n")
    (project / "fn" / "etc").symlink_to(outside)
    (project / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\nfunctions: {fn: {lang: python3-gpu, handler: ./fn, image: fn}}\n"
    )
    spec = load_stack(project / "stack.yml").functions["fn"]
    with pytest.raises(BuildError, match=r"^functions.fn.handler: etc links outside the stack file's folder"):
        shrinkwrap(spec)
    assert not list(project.rglob("secret"))


def test_build_reports_each_step(project, tmp_path):
    steps: list[tuple[str, int]] = []
    build(
        project.functions["fn"],
        ImageStore(tmp_path / "images"),
        on_step=lambda label, total: steps.append((label, total)),
    )
    labels = [label for label, _ in steps]
    assert labels == [
        "shrink-wrap",
        "copy the context",
        "make the function environment",
        "pip install -r requirements.txt",  # the template's
        "pip install -r function/requirements.txt",  # the handler's
        "publish",
    ]
    assert {total for _, total in steps[1:]} == {6}  # known once the context is shrink-wrapped


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_build_progress_on_a_terminal_and_not_elsewhere(project, tmp_path, monkeypatch):
    (tmp_path / "fn" / "requirements.txt").write_text("# nothing to install\n")
    store = ImageStore(tmp_path / "images")
    for stream, shown in ((io.StringIO(), False), (_Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        with BuildProgress("fn") as progress:
            build(project.functions["fn"], store, on_step=progress)
        text = stream.getvalue()
        if shown:
            assert "fn:" in text and "make the function environment" in text and "5/5" in text
        else:
            assert text == ""
