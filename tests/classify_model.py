"""The classify example's ResNetMini (functions/classify/model.py) as TorchScript artifacts: the
real model the GPU Manager and scheduler tests upload, one per seed so each has its own digest."""

from __future__ import annotations

import io
import sys

import torch

from faas_gpu.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402


def scripted_resnet(seed: int) -> tuple[bytes, torch.nn.Module]:
    """The TorchScript bytes of a ResNetMini seeded with `seed`, and the module to compare with."""
    torch.manual_seed(seed)
    m = ResNetMini().eval()
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(m), buf)
    return buf.getvalue(), m
