"""The real-device checks (`make gpu-check`): every test here is marked `gpu` and skipped unless
this machine has an NVIDIA GPU that both torch (CUDA) and NVML see. They only read the device's
state: never change MIG mode or geometry, compute mode, clocks or persistence, never reset."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_missing() -> str | None:
    """Why there is no usable GPU here (None: there is one)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver: pynvml's NVMLError_LibraryNotFound and kin
        return f"no NVIDIA driver ({type(exc).__name__})"
    if count == 0:
        return "NVML sees no GPU"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device (a CPU-only wheel?)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_missing()
    for item in items:
        if "tests/gpu/" not in item.nodeid:
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"gpu: {reason}"))
