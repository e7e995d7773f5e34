"""`faas-gpu profile`: a model by MODULE:FACTORY or the functions of a stack file; bad input -> exit 2."""

import io
import sys
import textwrap

import pytest
import yaml

from faas_gpu.profiling import LatencyPredictor, ProfileStore
from faas_gpu.profiling.cli import ProgressBar, main

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3)).eval()


    def not_a_model():
        return 42


    def broken():
        raise RuntimeError("weights missing")


    NOT_CALLABLE = 3
    """
)
FAST = ["--batches", "1,2", "--threads", "1", "--repeat", "1", "--warmup", "0"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / ".faas-gpu"))
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "model.py").write_text(MODEL)
    (tmp_path / "syntax.py").write_text("def make(:\n")
    return tmp_path


def profile(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def write_stack(root, annotations_by_fn: dict[str, dict[str, str]]) -> None:
    functions = {
        name: {"lang": "python3-gpu", "handler": "./fn", "image": f"t/{name}:latest", "annotations": ann}
        for name, ann in annotations_by_fn.items()
    }
    stack = {"version": 1.0, "provider": {"name": "openfaas", "gateway": "http://127.0.0.1:8080"}}
    (root / "stack.yml").write_text(yaml.safe_dump({**stack, "functions": functions}))


def test_profiles_a_model_file_into_the_default_store(project, capsys):
    rc, out, _ = profile(capsys, "--model", "fn/model.py:make", "--input-shape", "12", "--name", "mlp", *FAST)
    assert rc == 0
    assert "mean error" in out and "predicted" in out
    with ProfileStore(project / ".faas-gpu" / "profiles.db") as store:
        p = LatencyPredictor(store)
        assert [(b, c, g) for b, c, g, _ in p.configs("mlp")] == [(1, 1, 0), (2, 1, 0)]


def test_profiles_a_dotted_module(project, capsys):
    rc, _, _ = profile(
        capsys, "--model", "faas_gpu.profiling.examples:textcnn", "--input-shape", "8", "--input-dtype", "int64",
        "--name", "textcnn", "--store", str(project / "p.db"), *FAST,
    )  # fmt: skip
    assert rc == 0
    with ProfileStore(project / "p.db") as store:
        assert LatencyPredictor(store).has("textcnn")


@pytest.mark.parametrize(
    ("args", "flag", "words"),
    [
        (["--model", "fn/model.py:make", "--name", "m"], "--input-shape", "required"),
        (["--model", "fn/model.py:make", "--input-shape", "12"], "--name", "required"),
        (["--model", "fn/model.py:make", "--input-shape", "3,x", "--name", "m"], "--input-shape", "3,x"),
        (["--model", "fn/model.py:make", "--input-shape", "0", "--name", "m"], "--input-shape", "like 3,32,32"),
        (["--model", "fn/model.py", "--input-shape", "12", "--name", "m"], "--model", "MODULE:FACTORY"),
        (["--model", "fn/model.py:nope", "--input-shape", "12", "--name", "m"], "--model", "has no 'nope'"),
        (["--model", "fn/model.py:not_a_model", "--input-shape", "12", "--name", "m"], "--model", "not a torch.nn"),
        (["--model", "fn/model.py:broken", "--input-shape", "12", "--name", "m"], "--model", "weights missing"),
        (["--model", "fn/model.py:NOT_CALLABLE", "--input-shape", "12", "--name", "m"], "--model", "not callable"),
        (["--model", "fn/absent.py:make", "--input-shape", "12", "--name", "m"], "--model", "no such file"),
        (["--model", "syntax.py:make", "--input-shape", "12", "--name", "m"], "--model", "SyntaxError"),
        (["--model", "no_such_pkg.mod:make", "--input-shape", "12", "--name", "m"], "--model", "cannot import"),
        (["--model", "fn/model.py:make", "--input-shape", "3,32,32", "--name", "m"], "--input-shape", "3,32,32"),
        (["--model", "fn/model.py:make", "--input-shape", "12", "--name", "m", "--batches", "0"], "--batches", "0"),
        (["--model", "fn/model.py:make", "--input-shape", "12", "--name", "m", "--repeat", "0"], "--repeat", ">= 1"),
        (["--model", "fn/model.py:make", "-f", "stack.yml", "--input-shape", "12", "--name", "m"], "--model", "-f"),
        ([], "-f stack.yml", "--model"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(project, capsys, args, flag, words):
    rc, _, err = profile(capsys, *FAST, *args)  # args last: theirs win
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("faas-gpu profile: ") and flag in line and words in line
    if "3,32,32" not in args:  # refused before the store is touched
        assert not (project / ".faas-gpu" / "profiles.db").exists()


def test_stack_functions_are_profiled_under_their_model_name(project, capsys):
    write_stack(
        project,
        {
            "mlp": {
                "com.faas-gpu.model": "mlp-12",
                "com.faas-gpu.model-source": "model.py:make",
                "com.faas-gpu.input-shape": "12",
            },
            "plain": {},
        },
    )
    rc, out, err = profile(capsys, "-f", "stack.yml", *FAST)
    assert rc == 0 and "skipping plain" in err and "mlp-12" in out
    with ProfileStore(project / ".faas-gpu" / "profiles.db") as store:
        assert LatencyPredictor(store).has("mlp-12")


@pytest.mark.parametrize(
    ("annotations", "fn_args", "words"),
    [
        ({"com.faas-gpu.model-source": "model.py:make"}, [], "functions.mlp.annotations.com.faas-gpu.input-shape"),
        ({"com.faas-gpu.model-source": "model.py:make", "com.faas-gpu.input-shape": "a"}, [], "input-shape"),
        ({"com.faas-gpu.model-source": "nope.py:make", "com.faas-gpu.input-shape": "12"}, [], "model-source"),
        ({"com.faas-gpu.model-source": "model.py:zz", "com.faas-gpu.input-shape": "12"}, [], "model-source"),
        (
            {
                "com.faas-gpu.model-source": "model.py:make",
                "com.faas-gpu.input-shape": "12",
                "com.faas-gpu.input-dtype": "int7",
            },
            [],
            "com.faas-gpu.input-dtype",
        ),  # fmt: skip
        ({}, ["mlp"], "functions.mlp.annotations: com.faas-gpu.model-source is required"),
        ({}, [], "no function has the annotation com.faas-gpu.model-source"),
        ({"com.faas-gpu.model-source": "model.py:make", "com.faas-gpu.input-shape": "12"}, ["ghost"], "ghost"),
    ],
)
def test_bad_annotations_name_the_function_and_annotation(project, capsys, annotations, fn_args, words):
    write_stack(project, {"mlp": annotations})
    rc, _, err = profile(capsys, "-f", "stack.yml", *fn_args, *FAST)
    assert rc == 2
    assert words in err.strip().splitlines()[-1]


def test_a_broken_stack_file_is_exit_2(project, capsys):
    (project / "stack.yml").write_text("functions: [\n")
    rc, _, err = profile(capsys, "-f", "stack.yml", *FAST)
    assert rc == 2 and "stack.yml" in err


def test_a_model_failing_while_measured_is_one_line_and_exit_1(project, capsys, monkeypatch):
    import faas_gpu.profiling.cli as cli

    def oom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore torch detail")

    monkeypatch.setattr(cli, "profile_model", oom)
    rc, _, err = profile(capsys, "--model", "fn/model.py:make", "--input-shape", "12", "--name", "m", *FAST)
    assert (
        rc == 1
        and err.strip()
        == "faas-gpu profile: profiling m failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )


def test_progress_is_a_bar_on_a_terminal_and_nothing_in_a_log(project, capsys, monkeypatch):
    """tqdm's `disable=None`: captured stderr is not a terminal, so no bar and no step lines."""
    rc, _, err = profile(capsys, "--model", "fn/model.py:make", "--input-shape", "12", "--name", "quiet", *FAST)
    assert rc == 0 and "\r" not in err and "config/s" not in err and "  quiet: batch" not in err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = ProgressBar("mlp", 2)
    bar.step("mlp: batch 1, 1 threads, cpu")
    bar.step("mlp: batch 2, 1 threads, cpu: repeats spread 45%, again")
    bar.step("mlp: batch 2, 1 threads, cpu")
    bar.close()
    shown = term.getvalue()
    assert "mlp" in shown and "2/2" in shown and "repeats spread 45%, again" in shown
