"""GPU unit discovery, with NVML faked at the pynvml call boundary (no GPU here)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pynvml
import pytest

from gpu_manager.discovery import cpu_units, discover_units

GIB = 1024**3


class FakeNVML:
    """The pynvml functions discovery calls, over a described machine; errors are pynvml's own."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE

    def __init__(self, gpus, driver=True):
        self.gpus, self.driver, self.calls = gpus, driver, []

    def nvmlInit(self):  # noqa: N802
        if not self.driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.calls.append("init")

    def nvmlShutdown(self):  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return h["uuid"]

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return h["name"].encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(total=h["mem"], free=h["mem"], used=0)

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        if "mig" not in h:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = self.NVML_DEVICE_MIG_ENABLE if h["mig"] is not None else self.NVML_DEVICE_MIG_DISABLE
        return (mode, mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):  # noqa: N802
        slots = h["mig"]
        if i >= len(slots) or slots[i] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return slots[i]


def test_whole_gpus_and_mig_slices_become_units():
    a100_mig = {
        "uuid": "GPU-a",
        "name": "NVIDIA A100-SXM4-80GB",
        "mem": 80 * GIB,
        "mig": [
            {"uuid": "MIG-1", "name": "NVIDIA A100 3g.40gb", "mem": 40 * GIB},
            None,  # an empty slot
            {"uuid": "MIG-2", "name": "NVIDIA A100 1g.10gb", "mem": 10 * GIB},
        ],
    }
    h100 = {"uuid": "GPU-b", "name": "NVIDIA H100", "mem": 80 * GIB, "mig": None}
    rtx = {"uuid": "GPU-c", "name": "GeForce RTX 2080", "mem": 8 * GIB}  # not MIG-capable
    nvml = FakeNVML([a100_mig, h100, rtx])
    units = discover_units(nvml)
    assert [(u.id, u.kind, u.memory_mb, u.index, u.parent) for u in units] == [
        ("MIG-1", "mig", 40 * 1024, 0, "GPU-a"),
        ("MIG-2", "mig", 10 * 1024, 0, "GPU-a"),
        ("GPU-b", "gpu", 80 * 1024, 1, None),
        ("GPU-c", "gpu", 8 * 1024, 2, None),
    ]
    assert units[0].name == "NVIDIA A100 3g.40gb"
    assert nvml.calls == ["init", "shutdown"]


def test_no_driver_means_no_gpu_units():
    assert discover_units(FakeNVML([], driver=False)) == []


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="this machine has an NVIDIA driver")
def test_the_real_pynvml_without_a_driver_finds_nothing():
    assert discover_units() == []


def test_cpu_units_are_emulated_with_a_budget():
    units = cpu_units(2, 4096)
    assert [(u.id, u.kind, u.memory_mb) for u in units] == [("cpu-0", "cpu", 4096.0), ("cpu-1", "cpu", 4096.0)]
    with pytest.raises(ValueError, match="cpu units"):
        cpu_units(0, 1)
