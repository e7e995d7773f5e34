"""The job API's binary tensor format: a batch goes over the wire as raw bytes, not JSON.

    b"FGT1" | u32 header length (little endian) | header (JSON: dtype, shape) | raw tensor bytes

Raw little-endian bytes cost one copy each way (`encode` copies the tensor's bytes once into the
message, `decode` uses a writable message in place and copies `bytes` once); JSON would turn a
8x3x32x32 float batch into ~200 KB of text and parse it number by number. Part of the contract:
the instance's GPU client encodes, the scheduler and the GPU Manager check (`check`, no copy),
the workers decode.
"""

from __future__ import annotations

import json
import math
import struct

import torch

from .errors import WireError
from .headers import TENSOR_TYPE

__all__ = ["DTYPES", "MAGIC", "MAX_HEADER", "TENSOR_TYPE", "WireError", "check", "decode", "encode"]

MAGIC = b"FGT1"
MAX_HEADER = 4096
ALIGN = 16
"""`encode` pads the header with spaces so the raw bytes start at a multiple of this: a decoder
that uses a message's buffer in place gets an aligned tensor."""
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
    header += b" " * (-(8 + len(header)) % ALIGN)  # JSON allows the spaces; the raw bytes start aligned
    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return b"".join((MAGIC, struct.pack("<I", len(header)), header, raw))  # one copy of the tensor's bytes


def check(data: bytes | bytearray | memoryview) -> tuple[torch.dtype, list[int], int]:
    """A message's (dtype, shape, offset of its raw bytes) when it is well formed (WireError
    otherwise), without copying its bytes: what a hop that only passes the batch on checks."""
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
    # exact (no int64 wrap-around for an absurd shape), and no tensor made: every hop checks each batch
    expected = math.prod(shape) * dtype.itemsize
    if len(view) - 8 - hlen != expected:
        raise WireError(f"body: shape {shape} of {header['dtype']} needs {expected} bytes, got {len(view) - 8 - hlen}")
    return dtype, shape, 8 + hlen


def decode(data: bytes | bytearray | memoryview) -> torch.Tensor:
    """The tensor of a message. A writable message (a `bytearray`, or a writable view such as a
    worker's of its shared batch buffer) is used in place, without a copy: the tensor shares its
    memory; `bytes` are copied once, so the tensor is writable."""
    dtype, shape, offset = check(data)
    if len(data) == offset:
        return torch.empty(shape, dtype=dtype)
    in_place = isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly)
    buffer = data if in_place else bytearray(memoryview(data)[offset:])
    flat = torch.frombuffer(buffer, dtype=torch.uint8, offset=offset if in_place else 0)
    return flat.view(dtype).reshape(shape)
