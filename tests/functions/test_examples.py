"""The example functions (functions/echo, functions/classify), imported as the template does.

Each handler folder is copied to <tmp>/function/ and imported as the package `function`, so its
relative imports resolve exactly as in `build/<fn>/function/` under the template's index.py.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from faas_gpu.paths import REPO_ROOT
from tests.functions.handler_import import FUNCTIONS, Event, load_handler
from tests.module_files import load


@pytest.fixture(autouse=True)
def _restore_function_package():
    saved = {m: mod for m, mod in sys.modules.items() if m == "function" or m.startswith("function.")}
    yield
    for mod in [m for m in sys.modules if m == "function" or m.startswith("function.")]:
        del sys.modules[mod]
    sys.modules.update(saved)


def post_json(handler: ModuleType, payload, **kw) -> dict:
    return handler.handle(Event(json.dumps(payload).encode(), {"Content-Type": "application/json"}, **kw), None)


# --- echo ---


def test_echo_returns_text_body_and_tells_method_and_path(tmp_path):
    echo = load_handler("echo", tmp_path)
    res = echo.handle(Event(b"hello \xc3\xa9", {"Content-Type": "text/plain; charset=utf-8"}, path="/x/y"), None)
    assert res["statusCode"] == 200
    assert res["body"] == "hello é"
    assert res["headers"]["Content-Type"] == "text/plain; charset=utf-8"
    assert res["headers"]["X-Echo-Method"] == "POST" and res["headers"]["X-Echo-Path"] == "/x/y"


def test_echo_binary_body_comes_back_byte_for_byte(tmp_path):
    echo = load_handler("echo", tmp_path)
    res = echo.handle(Event(b"\xff\x00\xfe", method="PUT"), None)
    assert res["body"] == b"\xff\x00\xfe"
    assert res["headers"]["Content-type"] == "application/octet-stream"  # the key index.py looks for


def test_echo_empty_body(tmp_path):
    echo = load_handler("echo", tmp_path)
    res = echo.handle(Event(b"", method="GET"), None)
    assert res == {
        "statusCode": 200,
        "body": "",
        "headers": {"X-Echo-Method": "GET", "X-Echo-Path": "/", "Content-Type": "text/plain"},
    }


# --- classify ---


@pytest.fixture(scope="module")
def classify(tmp_path_factory):
    saved = {m: mod for m, mod in sys.modules.items() if m == "function" or m.startswith("function.")}
    handler = load_handler("classify", tmp_path_factory.mktemp("classify"))
    yield handler
    for mod in [m for m in sys.modules if m == "function" or m.startswith("function.")]:
        del sys.modules[mod]
    sys.modules.update(saved)


def test_weights_are_generated_when_missing(classify):
    weights = Path(classify.__file__).parent / "weights.pt"
    assert weights.is_file()  # made at import: the copy had no *.pt
    assert 500_000 < weights.stat().st_size < 2_000_000
    assert not list(weights.parent.glob("*.tmp"))
    n_params = sum(p.numel() for p in classify.model.parameters())
    assert 100_000 <= n_params <= 300_000
    assert not classify.model.training


def test_seed_0_is_deterministic(classify):
    res = post_json(classify, {"seed": 0})
    assert res["statusCode"] == 200, res
    body = res["body"]
    assert body["model"] == "resnet-mini" and body["batch"] == 1
    [pred] = body["predictions"]
    assert set(pred) == {"class", "label", "score"}
    assert 0 <= pred["class"] < 10 and pred["label"] == classify.LABELS[pred["class"]]
    assert 0.1 <= pred["score"] <= 1.0  # the top of 10 softmax scores
    assert post_json(classify, {"seed": 0})["body"] == body
    # pinned for torch 2.13 on the CPU: a change here means make_weights or the model changed
    assert (pred["class"], pred["label"]) == (2, "bird")
    assert pred["score"] == pytest.approx(0.111055, abs=1e-4)
    assert json.loads(json.dumps(body)) == body  # what jsonify sends


def test_same_weights_from_a_fresh_build(classify, tmp_path):
    """Weights generated in another folder (another replica, another build) give the same answers."""
    first = post_json(classify, {"seed": 0})["body"]
    other = load_handler("classify", tmp_path)
    assert other is not classify
    again = post_json(other, {"seed": 0})["body"]
    assert again["predictions"][0]["class"] == first["predictions"][0]["class"]
    assert again["predictions"][0]["score"] == pytest.approx(first["predictions"][0]["score"], abs=1e-5)


def test_weights_file_is_loaded_when_present(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FUNCTIONS / "classify", src, ignore=shutil.ignore_patterns("__pycache__", "*.pt"))
    proc = subprocess.run(
        [sys.executable, str(src / "make_weights.py")], capture_output=True, text=True, timeout=120, check=True
    )
    assert f"wrote {src / 'weights.pt'}" in proc.stdout  # the default: beside make_weights.py
    stamp = (src / "weights.pt").stat().st_mtime_ns
    handler = load_handler("classify", tmp_path / "built", src=src)
    weights = tmp_path / "built" / "function" / "weights.pt"
    assert weights.stat().st_mtime_ns == stamp  # loaded, not regenerated
    assert post_json(handler, {"seed": 3})["statusCode"] == 200


def test_batch_of_two_images(classify):
    zeros = [[[0.0] * 32] * 32] * 3
    ones = [[[1.0] * 32] * 32] * 3
    res = post_json(classify, {"inputs": [zeros, ones]})
    assert res["statusCode"] == 200, res
    assert res["body"]["batch"] == 2 and len(res["body"]["predictions"]) == 2
    single = post_json(classify, {"inputs": ones})["body"]  # a 3x32x32 list is a batch of one
    assert single["batch"] == 1
    assert single["predictions"][0]["class"] == res["body"]["predictions"][1]["class"]
    assert single["predictions"][0]["score"] == pytest.approx(res["body"]["predictions"][1]["score"], abs=1e-5)


def test_raw_float32_bytes(classify):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    raw = struct.pack(f"<{x.numel()}f", *x.flatten().tolist())
    res = classify.handle(Event(raw, {"Content-Type": "application/octet-stream"}), None)
    assert res["statusCode"] == 200 and res["body"]["batch"] == 2
    seeded = post_json(classify, {"seed": 0})["body"]["predictions"][0]
    assert res["body"]["predictions"][0]["class"] == seeded["class"]  # seed 0 is the first image here
    assert res["body"]["predictions"][0]["score"] == pytest.approx(seeded["score"], abs=1e-5)
    untyped = classify.handle(Event(raw), None)  # raw floats without a content type
    assert untyped["body"] == res["body"]


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        (b"not json", {}, "body:"),
        (b"[1, 2]", {}, "body:"),
        (b"{}", {}, "inputs:"),
        (b'{"inputs": [1, 2]}', {}, "inputs:"),
        (b'{"inputs": [[[1.0]]]}', {}, "inputs:"),
        (b'{"inputs": "cat.jpg"}', {}, "inputs:"),
        (b'{"inputs": [[["a"]]]}', {}, "inputs:"),
        (b'{"inputs": [[[1, 2], [3]]]}', {}, "inputs:"),
        (b'{"inputs": []}', {}, "inputs:"),
        (json.dumps({"inputs": [[[float("nan")] * 32] * 32] * 3}).encode(), {}, "inputs:"),
        (b'{"seed": "zero"}', {}, "seed:"),
        (b'{"seed": true}', {}, "seed:"),
        (b'{"seed": -1}', {}, "seed:"),
        (b'{"seed": 1e400}', {}, "seed:"),
        (b'{"seed": 99999999999999999999999}', {}, "seed:"),
        (b"\x00\x01\x02", {"Content-Type": "application/octet-stream"}, "body:"),
    ],
)
def test_bad_input_is_400_naming_the_field(classify, body, headers, field):
    res = classify.handle(Event(body, headers), None)
    assert res["statusCode"] == 400, res
    assert res["body"].startswith(field), res["body"]
    assert res["headers"]["Content-Type"] == "text/plain"


def test_json_nested_100000_deep_is_400(classify):
    res = classify.handle(Event(b"[" * 100_000 + b"]" * 100_000, {"Content-Type": "application/json"}), None)
    assert res["statusCode"] == 400 and res["body"].startswith("body:"), res


def test_too_large_a_batch_is_413(classify):
    res = classify.handle(Event(b"\x00" * (4 * 3 * 32 * 32) * 65, {"Content-Type": "application/octet-stream"}), None)
    assert res["statusCode"] == 413 and res["body"].startswith("inputs:")


def test_make_weights_script_is_deterministic(tmp_path):
    outs = [tmp_path / "a.pt", tmp_path / "b.pt"]
    for out in outs:
        proc = subprocess.run(
            [sys.executable, str(FUNCTIONS / "classify" / "make_weights.py"), str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert f"wrote {out}" in proc.stdout
    a, b = (torch.load(p, weights_only=True) for p in outs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    again = subprocess.run(
        [sys.executable, str(FUNCTIONS / "classify" / "make_weights.py"), str(outs[0])], capture_output=True, text=True
    )
    assert "exists" in again.stdout


# --- the python3-gpu template: the ways a model is saved and loaded ---

TEMPLATE = REPO_ROOT / "templates" / "python3-gpu"

NET = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))
"""

HANDLERS = {
    # 1. a torch.export program (faas_gpu.save_model): no class of the helper script needed
    "export": """import json
from pathlib import Path

import torch

model = torch.export.load(Path(__file__).parent / "model.pt2").module()
""",
    # 2. a state dict + the module's code in the handler, handed to faas_gpu.remote
    "state_dict": """import json
from pathlib import Path

import torch

from faas_gpu import remote

from .net import Net

net = Net()
net.load_state_dict(torch.load(Path(__file__).parent / "weights.pt", weights_only=True))
model = remote(net)
""",
    # a whole-module torch.save from a helper script: the class is `net.Net` there, `function.net` here
    "pickle": """import json
from pathlib import Path

import torch

model = torch.load(Path(__file__).parent / "model.pt", weights_only=False)
""",
}
HANDLE = """

def handle(event, context):
    x = torch.tensor(json.loads(event.body)["inputs"], dtype=torch.float32)
    with torch.inference_mode():
        return {"statusCode": 200, "body": {"outputs": model(x).tolist()}}
"""


def _function_folder(tmp_path: Path, way: str) -> Path:
    """A function folder as a user's helper script leaves it: the net's code beside the handler,
    saved from a script that imported it as the top-level module `net`."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "net.py").write_text(NET)
    (folder / "handler.py").write_text(HANDLERS[way] + HANDLE)
    helper = {
        "export": "faas_gpu.save_model(net, torch.randn(1, 4), 'model.pt2')",
        "state_dict": "torch.save(net.state_dict(), 'weights.pt')",
        "pickle": "torch.save(net, 'model.pt')",
    }[way]
    script = f"import torch, faas_gpu\nfrom net import Net\ntorch.manual_seed(0)\nnet = Net().eval()\n{helper}\n"
    proc = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return folder


def _template_app(tmp_path: Path, src: Path, monkeypatch):
    """The template's index.py, imported as the watchdog runs it: function/ beside it, no scheduler."""
    from faas_gpu import client

    monkeypatch.delenv("FAAS_GPU_SCHEDULER_URL", raising=False)
    root = tmp_path / "run"
    shutil.copytree(src, root / "function")
    for mod in [m for m in sys.modules if m == "function" or m.startswith("function.")]:
        del sys.modules[mod]
    sys.path.insert(0, str(root))
    try:
        index = load("python3_gpu_index", TEMPLATE / "index.py")
    finally:
        sys.path.remove(str(root))
        client.uninstall()
    return index.app.test_client()


@pytest.mark.parametrize("way", ["export", "state_dict"])
def test_the_template_serves_a_model_saved_each_supported_way(tmp_path, monkeypatch, way):
    import warnings

    src = _function_folder(tmp_path, way)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no deprecated torch API on these paths
        app = _template_app(tmp_path, src, monkeypatch)
        for batch in (1, 3):  # save_model's batch dimension is dynamic
            r = app.post("/", data=json.dumps({"inputs": [[0.5, -1.0, 2.0, 0.0]] * batch}))
            assert r.status_code == 200, r.text
            assert len(r.get_json()["outputs"]) == batch


def test_a_whole_module_pickle_from_a_helper_script_is_served_as_an_error_saying_what_to_do(tmp_path, monkeypatch):
    """Not a ModuleNotFoundError crash loop: the replica stays up and every call says what to do."""
    app = _template_app(tmp_path, _function_folder(tmp_path, "pickle"), monkeypatch)
    r = app.post("/", data=json.dumps({"inputs": [[0.0] * 4]}))
    assert r.status_code == 500
    assert "the handler failed to load: NotConvertible" in r.text
    assert "model.pt is a pickled module whose class lives in module 'net' (Net)" in r.text
    assert "faas_gpu.save_model(model, example_input, 'model.pt2')" in r.text and "state_dict" in r.text


def test_a_whole_module_pickle_refused_by_weights_only_says_what_to_do(tmp_path):
    from faas_gpu import client

    src = _function_folder(tmp_path, "pickle")
    try:
        assert client.install() is False  # no scheduler: torch.load only gains the explanation
        with pytest.raises(client.NotConvertible, match="pickled module whose class lives in module 'net'"):
            torch.load(src / "model.pt")  # torch's default weights_only=True
        with pytest.raises(client.NotConvertible, match="faas_gpu.save_model"):
            torch.load(src / "model.pt", weights_only=False)
        buf = io.BytesIO()
        torch.save({"w": torch.ones(2)}, buf)  # state dicts and tensors load as before
        buf.seek(0)
        assert torch.equal(torch.load(buf)["w"], torch.ones(2))
    finally:
        client.uninstall()


def test_the_template_skeleton_documents_the_supported_ways():
    text = (TEMPLATE / "function" / "handler.py").read_text()
    for way in ("faas_gpu.save_model", "torch.export.load", "state_dict", "faas_gpu.remote", "TorchScript"):
        assert way in text


def test_faas_gpu_export_saves_a_script_model_the_handler_loads(tmp_path, capsys):
    from faas_gpu.cli import main

    (tmp_path / "net.py").write_text(
        NET + "\n\nclass Branchy(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x * 2 if x.sum() > 0 else x\n"
    )
    out = tmp_path / "function" / "model.pt2"
    out.parent.mkdir()
    assert main(["export", "--model", f"{tmp_path / 'net.py'}:Net", "--input-shape", "4", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "torch.export.load(path).module()" in said
    assert "batch: dynamic 1..4096" in said  # issue 43: which batch it accepts, as the scheduler reads it
    model = torch.export.load(out).module()  # no import of net.py needed
    assert model(torch.ones(5, 4)).shape == (5, 3)
    assert main(["export", "--model", f"{tmp_path / 'net.py'}:Branchy", "--input-shape", "4", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "cannot run on the GPU path" in err and "torch.cond" in err and "faas_gpu.remote" in err
    assert main(["export", "--model", "nope.py:Net", "--input-shape", "4"]) == 1
    assert "export: --model: no such file nope.py" in capsys.readouterr().err
