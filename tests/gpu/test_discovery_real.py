"""NVML discovery on the real device: the units the manager would serve, read-only."""

from gpu_manager.discovery import discover_units


def test_real_nvml_discovery_finds_every_gpu_with_its_memory():
    import pynvml

    units = discover_units(pynvml)
    assert units, "NVML reported GPUs, discovery found no unit"
    pynvml.nvmlInit()
    try:
        whole = [u for u in units if u.kind == "gpu"]
        for u in whole:
            handle = pynvml.nvmlDeviceGetHandleByIndex(u.index)
            total_mb = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
            assert 0 < u.memory_mb <= total_mb
    finally:
        pynvml.nvmlShutdown()
