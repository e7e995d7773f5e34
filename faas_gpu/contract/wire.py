"""The job API's binary tensor format: a batch goes over the wire as raw bytes, not JSON.

    b"FGT1" | u32 header length (little endian) | header (JSON: dtype, shape) | raw tensor bytes

Raw little-endian bytes cost one copy each way; JSON would turn a 8x3x32x32 float batch into
~200 KB of text and parse it number by number. Part of the contract: the instance's GPU client
encodes, the scheduler checks, the GPU Manager and its workers decode.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

from .errors import WireError
from .headers import TENSOR_TYPE

__all__ = ["DTYPES", "MAGIC", "MAX_HEADER", "TENSOR_TYPE", "WireError", "decode", "encode"]

MAGIC = b"FGT1"
MAX_HEADER = 4096
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def encode(tensor: torch.Tensor) -> bytes:
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype not in NAMES:
        raise WireError(f"dtype: {t.dtype} cannot be sent (supported: {', '.join(DTYPES)})")
    header = json.dumps({"dtype": NAMES[t.dtype], "shape": list(t.shape)}).encode()
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return MAGIC + struct.pack("<I", len(header)) + header + raw


def decode(data: bytes | bytearray | memoryview) -> torch.Tensor:
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise WireError("body: not a faas-gpu tensor message (expected the FGT1 header)")
    (hlen,) = struct.unpack("<I", view[4:8])
    if hlen > MAX_HEADER or 8 + hlen > len(view):
        raise WireError("body: truncated or oversized tensor header")
    try:
        header = json.loads(bytes(view[8 : 8 + hlen]))
        dtype = DTYPES[header["dtype"]]
        shape = [int(s) for s in header["shape"]]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested ~1000 deep
        raise WireError("header: needs dtype (one of " + ", ".join(DTYPES) + ") and shape") from None
    if any(s < 0 for s in shape):
        raise WireError(f"shape: {shape} has a negative dimension")
    payload = view[8 + hlen :]
    expected = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    if len(payload) != expected:
        raise WireError(f"body: shape {shape} of {header['dtype']} needs {expected} bytes, got {len(payload)}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)
