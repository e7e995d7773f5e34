"""GPU unit discovery, with NVML faked at the pynvml call boundary (no GPU here)."""

from __future__ import annotations

import os

import pytest

from gpu_manager.discovery import cpu_units, discover_units
from tests.fake_nvml import GIB, FakeNVML


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
