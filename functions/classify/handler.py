"""Classify 3x32x32 images with ResNetMini (plain torch, on the CPU here).

The model loads once, at import, from weights.pt beside this file (generated there by
make_weights when missing, so a fresh build works; if the folder is read-only the same weights
are generated in memory). Input, one of:
  - JSON {"inputs": [3][32][32] or [N][3][32][32] numbers}
  - JSON {"seed": int}: one deterministic random image (torch.randn with that seed)
  - raw float32 little-endian bytes of N images (Content-Type: application/octet-stream)
Output (JSON): {"model": "resnet-mini", "batch": N, "predictions": [{"class", "label", "score"}]}.
Bad input: 400 with a message that starts with the field at fault ("inputs: ...").
"""

import json
import math
import sys
from pathlib import Path

import torch

from .make_weights import generate, make_weights
from .model import LABELS, ResNetMini

WEIGHTS = Path(__file__).resolve().parent / "weights.pt"
IMAGE = (3, 32, 32)
IMAGE_BYTES = 4 * math.prod(IMAGE)
MAX_BATCH = 64
MODEL_NAME = "resnet-mini"


def _load_model() -> ResNetMini:
    if not WEIGHTS.exists():
        try:
            make_weights(WEIGHTS)
        except OSError as exc:  # read-only function folder: same weights, in memory
            print(f"classify: cannot write {WEIGHTS} ({exc}); generating weights in memory", file=sys.stderr)
    net = ResNetMini()
    state = torch.load(WEIGHTS, weights_only=True) if WEIGHTS.exists() else generate()
    net.load_state_dict(state)
    net.eval()
    return net


try:  # on faas-gpu the model runs on a GPU unit through the scheduler; elsewhere, right here
    from faas_gpu import remote
except ImportError:

    def remote(module):
        return module


torch.set_num_threads(1)
model = remote(_load_model())


class BadInput(ValueError):
    pass


def _raw(body: bytes) -> torch.Tensor:
    n = len(body) // IMAGE_BYTES
    if n == 0 or len(body) != n * IMAGE_BYTES:
        raise BadInput(f"body: raw input must be N float32 images of 3x32x32 ({IMAGE_BYTES} bytes each)")
    x = torch.frombuffer(bytearray(body), dtype=torch.float32)
    if sys.byteorder != "little":
        x = x.byteswap()  # pragma: no cover
    return _finite(x.reshape(n, *IMAGE))


def _finite(x: torch.Tensor) -> torch.Tensor:
    """Given inputs must be finite; a seed's `torch.randn` image is, and is not checked (~20 us)."""
    if not torch.isfinite(x).all():
        raise BadInput("inputs: values must be finite (no NaN or Infinity)")
    return x


def _json(body: bytes) -> torch.Tensor:
    try:
        data = json.loads(body or b"{}")
    except RecursionError:  # json's decoder recurses once per nesting level
        raise BadInput("body: JSON nested too deeply") from None
    except ValueError:
        if body and len(body) % IMAGE_BYTES == 0:  # raw floats sent without a content type
            return _raw(body)
        raise BadInput('body: must be JSON ({"inputs": ...} or {"seed": N}) or raw float32 images') from None
    if not isinstance(data, dict):
        raise BadInput("body: must be a JSON object")
    if "seed" in data:
        seed = data["seed"]
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise BadInput("seed: must be an integer in [0, 2^63)")
        return torch.randn(1, *IMAGE, generator=torch.Generator().manual_seed(seed))
    if "inputs" not in data:
        raise BadInput("inputs: is required (or give seed)")
    try:
        x = torch.tensor(data["inputs"], dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise BadInput("inputs: must be a nested list of numbers") from None
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dim() != 4 or tuple(x.shape[1:]) != IMAGE or x.shape[0] == 0:
        raise BadInput(f"inputs: shape must be [3,32,32] or [N,3,32,32] with N >= 1, got {list(x.shape)}")
    return _finite(x)


def _tensor(event) -> torch.Tensor:
    ctype = (event.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    return _raw(event.body) if ctype == "application/octet-stream" else _json(event.body)


def _error(status: int, message: str) -> dict:
    return {"statusCode": status, "body": message + "\n", "headers": {"Content-Type": "text/plain"}}


def _top(logits: list[float]) -> dict:
    """The top class of one image's logits and its softmax score, in plain Python: ten numbers,
    and each torch call lets the instance's other request threads take the GIL (its softmax, max
    and two tolist cost 30-50 us a request under 8-32 concurrent calls, against ~5 us here)."""
    top = max(range(len(logits)), key=logits.__getitem__)
    peak = logits[top]
    score = 1.0 / sum(math.exp(v - peak) for v in logits)
    return {"class": top, "label": LABELS[top], "score": round(score, 6)}


def handle(event, context):
    try:
        x = _tensor(event)
    except BadInput as exc:
        return _error(400, str(exc))
    if x.shape[0] > MAX_BATCH:
        return _error(413, f"inputs: at most {MAX_BATCH} images a request, got {x.shape[0]}")
    with torch.inference_mode():
        logits = model(x).tolist()
    predictions = [_top(row) for row in logits]
    return {
        "statusCode": 200,
        "body": {"model": MODEL_NAME, "batch": len(predictions), "predictions": predictions},
        "headers": {"Content-Type": "application/json"},
    }
