"""The generate example (functions/generate): textgenrnn's pretrained character model, from the
PyPI package `textgenrnn`, streaming text as Server-Sent Events as it is generated.

The handler is imported as the template does (tests/functions/handler_import.py), and served by
the real watchdog for the stream on the wire. The package and h5py are installed by `make`
(`pip install --no-deps textgenrnn`: it declares TensorFlow, which the function does not use);
without them these tests are skipped.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import math
import shutil
import sys

import pytest
import torch

from faas_gpu.build import build
from faas_gpu.imagestore import ImageStore
from faas_gpu.paths import REPO_ROOT, TEMPLATES_DIR
from faas_gpu.stack import load_stack
from tests.daemon_process import Daemon
from tests.functions.handler_import import FUNCTIONS, Event, load_handler
from tests.stack_process import StackProcess
from tests.templates.test_watchdog import Watchdog, inproc_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("textgenrnn") is None or importlib.util.find_spec("h5py") is None,
    reason="pip install --no-deps textgenrnn==2.0.0 h5py (make does) to test the generate example",
)

TITLES = (
    "What is the best way to learn a new language?",
    "I made a thing for my dog and he loves it",
    "TIL that the moon is not made of cheese",
)


@pytest.fixture(scope="module")
def generate(tmp_path_factory):
    saved = {m: mod for m, mod in sys.modules.items() if m == "function" or m.startswith("function.")}
    handler = load_handler("generate", tmp_path_factory.mktemp("generate"))
    yield handler
    for mod in [m for m in sys.modules if m == "function" or m.startswith("function.")]:
        del sys.modules[mod]
    sys.modules.update(saved)


def _events(body) -> list[tuple[str, dict]]:
    """(event name, data) of each Server-Sent Event in the streamed body's text."""
    text = "".join(body)
    out = []
    for block in text.split("\n\n"):
        if not block:
            continue
        name, data = "message", None
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data = json.loads(value)
        out.append((name, data))
    assert text.endswith("\n\n")
    return out


def _call(handler, payload: dict, accept: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", **({"Accept": accept} if accept else {})}
    return handler.handle(Event(json.dumps(payload).encode(), headers), None)


def test_the_packaged_weights_read_as_the_model_was_trained(generate):
    """The pretrained model predicts English text: a mean of about -1 nat a character on ordinary
    titles (uniform over the vocabulary would be -6.1; weights laid out wrongly, e.g. CuDNN's
    kernels read as a plain LSTM's, score below -9)."""
    model, vocab = generate.step, generate.vocab
    total, n = 0.0, 0
    for title in TITLES:
        seq = ["<s>", *title]
        for i in range(1, len(seq)):
            with torch.inference_mode():
                logp = torch.log_softmax(model(generate._window(seq[:i]))[0], dim=-1)
            total += float(logp[vocab[seq[i]]])
            n += 1
    assert total / n > -1.5, total / n
    assert math.log(1 / len(vocab)) < -6


def test_a_call_streams_one_event_per_character_then_the_end(generate):
    res = _call(generate, {"prefix": "I think", "max_chars": 40, "seed": 7})
    assert res["statusCode"] == 200 and res["headers"]["Content-Type"] == "text/event-stream"
    assert not isinstance(res["body"], str | bytes)  # a generator: the template streams it
    events = _events(res["body"])
    name, end = events[-1]
    texts = [data["text"] for name, data in events[:-1]]
    assert name == "end" and end["chars"] == len(texts) and end["stop"] in ("max_chars", "end_of_text")
    assert all(len(t) == 1 for t in texts) and (len(texts) == 40 or end["stop"] == "end_of_text")
    again = _events(_call(generate, {"prefix": "I think", "max_chars": 40, "seed": 7})["body"])
    assert again == events  # a seed makes it reproducible


def test_greedy_plain_text_and_the_end_of_a_text(generate):
    """temperature 0 takes the likeliest character each step (the same text each call); with
    Accept: text/plain the characters come as plain chunks."""
    res = _call(generate, {"prefix": "What is the best way to", "max_chars": 60, "temperature": 0}, "text/plain")
    assert res["headers"]["Content-Type"].startswith("text/plain")
    first = "".join(res["body"])
    second = "".join(
        _call(generate, {"prefix": "What is the best way to", "max_chars": 60, "temperature": 0}, "text/plain")["body"]
    )
    assert first == second and 0 < len(first) <= 60 and first.isprintable()


@pytest.mark.parametrize(
    "body, field",
    [
        (b"{not json", "body"),
        (b"[1]", "body"),
        (b'{"max_chars": 0}', "max_chars"),
        (b'{"max_chars": 5000}', "max_chars"),
        (b'{"max_chars": true}', "max_chars"),
        (b'{"temperature": -1}', "temperature"),
        (b'{"temperature": "hot"}', "temperature"),
        (b'{"seed": -3}', "seed"),
        (b'{"prefix": 5}', "prefix"),
        (b'{"prefix": "' + b"x" * 1001 + b'"}', "prefix"),
        (b'{"prompt": "hi"}', "prompt"),
    ],
)
def test_bad_input_is_400_naming_the_field(generate, body, field):
    res = generate.handle(Event(body, {"Content-Type": "application/json"}), None)
    assert res["statusCode"] == 400 and res["body"].startswith(f"{field}:"), res
    not_utf8 = generate.handle(Event(b"\xff\xfe", {"Content-Type": "text/plain"}), None)
    assert not_utf8["statusCode"] == 400 and not_utf8["body"].startswith("body:")


def test_a_plain_text_body_is_the_prefix(generate):
    res = generate.handle(Event("Ünïcode prefix".encode(), {"Content-Type": "text/plain"}), None)
    assert res["statusCode"] == 200 and _events(res["body"])[-1][0] == "end"


@pytest.mark.slow
def test_one_step_exports_with_a_dynamic_batch_for_the_gpu_path(generate, tmp_path):
    """The step is what `faas_gpu.remote` sends to the GPU path: a torch.export program with a
    dynamic batch, checked by the GPU Managers' own rules, that answers a batch of several
    streams' windows as the module does one by one."""
    import faas_gpu

    model = generate.step
    path = faas_gpu.save_model(model, torch.zeros(1, 40, dtype=torch.int64), tmp_path / "step.pt2")
    program = torch.export.load(path).module()
    windows = torch.cat([generate._window(["<s>", *t]) for t in TITLES])
    with torch.inference_mode():
        assert torch.allclose(program(windows), torch.cat([model(w[None]) for w in windows]), atol=1e-5)


def test_the_function_streams_through_the_watchdog(tmp_path):
    """The example as it is served (the template's index.py in the watchdog's process): events
    arrive as chunks, the first before the stream has ended, and the answer ends whole."""
    ctx = tmp_path / "ctx"
    shutil.copytree(TEMPLATES_DIR / "python3-gpu", ctx, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(ctx / "function")
    shutil.copytree(FUNCTIONS / "generate", ctx / "function", ignore=shutil.ignore_patterns("__pycache__"))
    wd = Watchdog(tmp_path, inproc_env(), ctx)
    try:
        wd.wait(timeout_s=120)
        conn = http.client.HTTPConnection("127.0.0.1", wd.port, timeout=60)
        conn.request(
            "POST", "/", body=json.dumps({"max_chars": 30, "seed": 1}), headers={"Content-Type": "application/json"}
        )
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("Transfer-Encoding") == "chunked"
        assert r.getheader("Content-Type") == "text/event-stream" and r.getheader("X-Model") == "textgenrnn"
        first = r.read1(65536).decode()
        assert first.startswith("data: {") and first.endswith("\n\n")
        rest = r.read().decode()
        events = _events([first, rest])
        assert events[-1][0] == "end" and len(events) == events[-1][1]["chars"] + 1
        conn.close()
    finally:
        wd.stop()


@pytest.mark.slow
def test_the_function_streams_from_its_sandboxed_replica_in_a_stack(tmp_path):
    """generate as `make up` runs it: built from the repository's stack.yml into a real stack's
    image store and deployed as `faas-gpu up` deploys it, in a replica's sandbox (its own uid,
    its own /tmp, the state folder hidden, its token a file), each step on the GPU path (a
    scheduler and a GPU Manager on the cpu back end, which check the exported step and run it):
    the model's files are found in the stack's environment and read there, and the events
    arrive through the gateway as chunks."""
    home = tmp_path / "home"
    home.mkdir()
    spec = load_stack(REPO_ROOT / "stack.yml").functions["generate"]
    manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "256", "--node", "local")
    scheduler = Daemon("scheduler", home)
    with pytest.MonkeyPatch.context() as env:  # the first step exports, uploads and loads it: a cold start
        env.setenv("upstream_timeout", "300s")
        stack = StackProcess(home, "--scheduler", scheduler.url).start()
    try:
        build(spec, ImageStore(home / "images"), stack_dir=REPO_ROOT)
        r = stack.request("POST", "/system/functions", json=spec.to_deployment(), timeout=30)
        assert r.status_code == 202, r.text
        stack.wait_ready("generate", timeout_s=180)
        host, port = stack.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request(
            "POST",
            "/function/generate",
            body=json.dumps({"prefix": "The best", "max_chars": 25, "seed": 3}),
            headers={"Content-Type": "application/json"},
        )
        res = conn.getresponse()
        assert res.status == 200 and res.getheader("Transfer-Encoding") == "chunked", (
            res.read()[:300],
            stack.log_tail(6000),
            manager.log.read_text()[-3000:],
        )
        assert res.getheader("Content-Type") == "text/event-stream" and res.getheader("X-Model") == "textgenrnn"
        first = res.read1(65536).decode()
        assert first.startswith("data: {")
        events = _events([first, res.read().decode()])
        assert events[-1][0] == "end" and len(events) == events[-1][1]["chars"] + 1
        conn.close()
        bad = stack.send("POST", f"{stack.url}/function/generate", data=b'{"max_chars": 0}', timeout=60)
        assert bad.status_code == 400 and bad.text.startswith("max_chars:")
    finally:
        stack.stop()
        scheduler.kill()
        manager.kill()
