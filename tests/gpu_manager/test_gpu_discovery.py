"""GPU unit discovery, with NVML faked at the pynvml call boundary (no GPU here)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from gpu_manager.discovery import cpu_units, discover_units, memory_info, read_usage
from tests.fake_nvml import GIB, MIB, FakeGPU, FakeNVML, MigNVML


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


# -- one memory figure: NVML v2's total - reserved (finding 7) --------------------------------


def test_units_are_sized_by_nvml_v2_total_minus_reserved_and_v1_where_v2_is_missing():
    new = {"uuid": "GPU-n", "name": "NVIDIA H100", "mem": 80 * GIB, "reserved": 512 * 1024**2, "used": GIB}
    old = {"uuid": "GPU-o", "name": "Tesla V100", "mem": 16 * GIB, "reserved": 256 * 1024**2, "v2": False}
    units = discover_units(FakeNVML([new, old]))
    assert [(u.id, u.memory_mb) for u in units] == [("GPU-n", 80 * 1024 - 512), ("GPU-o", 16 * 1024)]
    nvml = FakeNVML([new])
    mem = memory_info(nvml, new)
    assert (mem.total, mem.used, mem.reserved, mem.version) == (80 * GIB - 512 * 1024**2, GIB, 512 * 1024**2, 2)
    assert memory_info(nvml, old).version == 1


def test_v2_used_without_the_reserved_part_is_read_from_the_figures_too():
    """R525's reference: v2's `used` includes `reserved`; a driver that reports it apart gives the same."""

    class Apart(FakeNVML):
        def nvmlDeviceGetMemoryInfo(self, h, version=None):  # noqa: N802
            return SimpleNamespace(version=version, total=10 * GIB, reserved=GIB, used=2 * GIB, free=7 * GIB)

    mem = memory_info(Apart([]), {})
    assert (mem.total, mem.used) == (9 * GIB, 2 * GIB)


def test_mig_units_and_usage_read_the_same_figure():
    gpu = FakeGPU.h100_80gb(mig=False, reserved_mb=330)
    gpu.used_mb = 1000
    nvml = MigNVML([gpu])
    (unit,) = discover_units(nvml)
    assert unit.memory_mb == 81559 - 330
    usage = read_usage(nvml, [unit])[unit.id]
    assert usage.total_bytes == unit.memory_mb * MIB and usage.used_bytes == 1000 * MIB
    assert discover_units(MigNVML([gpu], memory_v2=False))[0].memory_mb == 81559  # an old driver: v1

    a100 = FakeGPU.a100_40gb(reserved_mb=300)
    nvml = MigNVML([a100], privileged=False)  # a non-root manager: the parent's memory is privileged
    nvml.preset(a100, [("1g.5gb", 0)])
    (mig_unit,) = discover_units(nvml)
    assert mig_unit.memory_mb == 4864  # NVML's figure for a 1g.5gb, not the name's 5120
    assert read_usage(nvml, [mig_unit])[mig_unit.id].total_bytes == 4864 * MIB
