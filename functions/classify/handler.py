"""Classify 3x32x32 images with ResNetMini (plain torch, on the CPU here).

The model loads once, at import. Input (JSON): {"inputs": [3][32][32] or [N][3][32][32] floats}
or {"seed": int} for a deterministic random image; or raw float32 little-endian bytes of N
images. Output: {"model", "batch", "predictions": [{"class", "label", "score"}]}.
"""

import json
from pathlib import Path

import torch

from .make_weights import make_weights
from .model import LABELS, ResNetMini

WEIGHTS = Path(__file__).resolve().parent / "weights.pt"
IMAGE = (3, 32, 32)
MAX_BATCH = 64

torch.set_num_threads(1)
if not WEIGHTS.exists():
    make_weights(WEIGHTS)
model = ResNetMini()
model.load_state_dict(torch.load(WEIGHTS, weights_only=True))
model.eval()


class BadInput(ValueError):
    pass


def _tensor(event) -> torch.Tensor:
    ctype = event.headers.get("Content-Type", "")
    if ctype.startswith("application/octet-stream"):
        n = len(event.body) // (4 * 3 * 32 * 32)
        if n == 0 or len(event.body) != n * 4 * 3 * 32 * 32:
            raise BadInput("body: raw input must be N float32 images of 3x32x32")
        return torch.frombuffer(bytearray(event.body), dtype=torch.float32).reshape(n, *IMAGE)
    try:
        data = json.loads(event.body or b"{}")
    except ValueError:
        raise BadInput('body: must be JSON ({"inputs": ...} or {"seed": N})') from None
    if not isinstance(data, dict):
        raise BadInput("body: must be a JSON object")
    if "seed" in data:
        if not isinstance(data["seed"], int):
            raise BadInput("seed: must be an integer")
        return torch.randn(1, *IMAGE, generator=torch.Generator().manual_seed(data["seed"]))
    if "inputs" not in data:
        raise BadInput("inputs: is required (or give seed)")
    try:
        x = torch.tensor(data["inputs"], dtype=torch.float32)
    except (TypeError, ValueError):
        raise BadInput("inputs: must be a nested list of numbers") from None
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dim() != 4 or tuple(x.shape[1:]) != IMAGE:
        raise BadInput(f"inputs: shape must be [3,32,32] or [N,3,32,32], got {list(x.shape)}")
    return x


def handle(event, context):
    try:
        x = _tensor(event)
    except BadInput as exc:
        return {"statusCode": 400, "body": str(exc) + "\n", "headers": {"Content-Type": "text/plain"}}
    if x.shape[0] > MAX_BATCH:
        return {"statusCode": 413, "body": f"inputs: at most {MAX_BATCH} images\n"}
    with torch.inference_mode():
        probs = torch.softmax(model(x), dim=1)
    scores, classes = probs.max(dim=1)
    predictions = [
        {"class": int(c), "label": LABELS[int(c)], "score": round(float(s), 6)}
        for c, s in zip(classes, scores, strict=True)
    ]
    return {
        "statusCode": 200,
        "body": {"model": "resnet-mini", "batch": len(predictions), "predictions": predictions},
    }
