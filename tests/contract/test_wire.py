"""The binary tensor format of the GPU Manager's job API."""

import struct

import pytest
import torch

from faas_gpu.contract.wire import MAGIC, WireError, decode, encode


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_round_trip_keeps_dtype_shape_and_values(dtype):
    t = (torch.arange(24).reshape(2, 3, 4) % 2).to(dtype)
    back = decode(encode(t))
    assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


def test_non_contiguous_and_empty_tensors():
    t = torch.randn(4, 6).t()
    assert torch.equal(decode(encode(t)), t)
    e = torch.empty(0, 3)
    assert decode(encode(e)).shape == (0, 3)


def test_the_payload_is_raw_bytes_not_text():
    t = torch.zeros(8, 3, 32, 32)
    assert len(encode(t)) < t.numel() * 4 + 100


@pytest.mark.parametrize(
    "data, message",
    [
        (b"nope", "FGT1"),
        (MAGIC + struct.pack("<I", 10) + b"{}", "truncated"),
        (MAGIC + struct.pack("<I", 2) + b"{}", "header"),
        (MAGIC + struct.pack("<I", 30) + b'{"dtype":"float32","shape":[2]}'[:30], "header"),
        (MAGIC + struct.pack("<I", 4000) + b"[" * 2000 + b"]" * 2000, "header"),  # nested too deep for json
    ],
)
def test_malformed_messages_name_the_problem(data, message):
    with pytest.raises(WireError, match=message):
        decode(data)


def test_payload_size_must_match_the_shape():
    msg = encode(torch.zeros(2, 2))
    with pytest.raises(WireError, match="needs 16 bytes, got 12"):
        decode(msg[:-4])
    with pytest.raises(WireError, match="dtype"):
        encode(torch.zeros(2, dtype=torch.complex64))


def test_a_shape_whose_size_overflows_64_bits_is_refused_not_taken_for_empty():
    """2^32 x 2^32 float32 is 2^66 bytes: counted in int64 it wrapped to 0, and a message with no
    bytes at all passed the check, to fail later allocating the tensor."""
    header = b'{"dtype": "float32", "shape": [4294967296, 4294967296]}'
    with pytest.raises(WireError, match="needs 73786976294838206464 bytes, got 0"):
        decode(MAGIC + struct.pack("<I", len(header)) + header)
