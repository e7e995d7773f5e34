"""Generate text with textgenrnn's pretrained character model, streamed as it is generated.

The model (functions/generate/model.py) is the one the PyPI package `textgenrnn` ships, read
offline from its files; one character is one model step, and each step's character is sent the
moment it is sampled: the answer's body is a generator, which python3-gpu streams.

Input (all optional), one of:
  - JSON {"prefix": "text to continue", "max_chars": 200, "temperature": 0.5, "seed": 7}
  - any other body: UTF-8 text, the prefix
Output: Server-Sent Events (`text/event-stream`), one event per character:
    data: {"text":"T"}
  then `event: end` with {"chars": N, "stop": "end_of_text" | "max_chars"}. With
  `Accept: text/plain` the characters themselves, as plain chunks. A seed makes the text
  reproducible; without one each call differs. Bad input: 400 naming the field.

Each step goes through the GPU path (`faas_gpu.remote`): the step exports with a dynamic batch,
so the steps of concurrent streams in one instance are batched together. A caller that goes away
stops the generation at its next character (the generator is closed).
"""

import json

import torch

from .model import META_TOKEN, WINDOW, load_packaged, load_vocab

MODEL_NAME = "textgenrnn"
MAX_CHARS = 1000
MAX_PREFIX = 1000
DEFAULT_CHARS = 200
DEFAULT_TEMPERATURE = 0.5

try:  # on faas-gpu the model runs on a GPU unit through the scheduler; elsewhere, right here
    from faas_gpu import remote
except ImportError:

    def remote(module):
        return module


torch.set_num_threads(1)
vocab = load_vocab()
chars = {i: c for c, i in vocab.items()}
step = remote(load_packaged())


class BadInput(ValueError):
    pass


def _options(event) -> dict:
    body = event.body or b""
    ctype = (event.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if ctype == "application/json" or body.lstrip().startswith(b"{"):
        try:
            data = json.loads(body)
        except RecursionError:
            raise BadInput("body: JSON nested too deeply") from None
        except ValueError:
            raise BadInput('body: must be JSON ({"prefix": "...", "max_chars": N}) or plain text') from None
        if not isinstance(data, dict):
            raise BadInput("body: must be a JSON object")
    else:
        try:
            data = {"prefix": body.decode("utf-8")}
        except UnicodeDecodeError:
            raise BadInput("body: plain text must be UTF-8") from None
    unknown = sorted(set(data) - {"prefix", "max_chars", "temperature", "seed"})
    if unknown:
        raise BadInput(f"{unknown[0]}: is not an option (prefix, max_chars, temperature, seed)")
    prefix = data.get("prefix", "")
    if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX:
        raise BadInput(f"prefix: must be a string of at most {MAX_PREFIX} characters")
    max_chars = data.get("max_chars", DEFAULT_CHARS)
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or not 1 <= max_chars <= MAX_CHARS:
        raise BadInput(f"max_chars: must be an integer from 1 to {MAX_CHARS}")
    temperature = data.get("temperature", DEFAULT_TEMPERATURE)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise BadInput("temperature: must be a number from 0 (always the likeliest) to 2")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise BadInput("seed: must be a non-negative integer")
    return {"prefix": prefix, "max_chars": max_chars, "temperature": float(temperature), "seed": seed}


def _window(text: list[str]) -> torch.Tensor:
    """The last WINDOW characters as ids, left-padded with 0 (an unknown character is 0, as
    textgenrnn encodes it)."""
    ids = [vocab.get(c, 0) for c in text[-WINDOW:]]
    return torch.tensor([[0] * (WINDOW - len(ids)) + ids], dtype=torch.int64)


def generate(prefix: str, max_chars: int, temperature: float, seed: int | None):
    """Yield (character, None) as each is sampled, then (None, why it stopped)."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    text = [META_TOKEN, *prefix]
    for _ in range(max_chars):
        with torch.inference_mode():
            logits = step(_window(text))[0].float().clone()
            logits[0] = float("-inf")  # 0 pads the window; never a character
            if temperature == 0:
                index = int(logits.argmax())
            else:
                index = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator))
        char = chars[index]
        if char == META_TOKEN:
            yield None, "end_of_text"
            return
        text.append(char)
        yield char, None
    yield None, "max_chars"


def _events(options: dict):
    count = 0
    for char, stop in generate(**options):
        if char is not None:
            count += 1
            yield f"data: {json.dumps({'text': char}, ensure_ascii=False, separators=(',', ':'))}\n\n"
        else:
            yield f"event: end\ndata: {json.dumps({'chars': count, 'stop': stop})}\n\n"


def _plain(options: dict):
    for char, _ in generate(**options):
        if char is not None:
            yield char


def handle(event, context):
    try:
        options = _options(event)
    except BadInput as exc:
        return {"statusCode": 400, "body": f"{exc}\n", "headers": {"Content-Type": "text/plain"}}
    accept = (event.headers.get("Accept") or "").lower()
    if "text/plain" in accept and "text/event-stream" not in accept:
        return {
            "statusCode": 200,
            "body": _plain(options),
            "headers": {"Content-Type": "text/plain; charset=utf-8", "X-Model": MODEL_NAME},
        }
    return {
        "statusCode": 200,
        "body": _events(options),
        "headers": {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Model": MODEL_NAME},
    }
