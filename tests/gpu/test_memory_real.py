"""Memory accounting and device faults on the real GPU (issue 19, findings 1 and 4): what the
manager charges a model is within 10% of NVML's own per-process figure for its worker, a larger
batch grows it, and a device fault replaces the worker instead of blaming the input."""

from __future__ import annotations

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager.discovery import discover_units
from gpu_manager.manager import GPUManager
from gpu_manager.memory import nvml_process_mb, unit_handle
from gpu_manager.worker import DeviceFault
from tests.torchscript import torchscript_bytes


class Wide(torch.nn.Module):
    """~64 MB of weights, and activations that grow with the batch."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])

    def forward(self, x):
        return self.layers(x)


class Lookup(torch.nn.Module):
    """An embedding lookup: an index past the table is a device-side assert on CUDA (sticky)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return torch.nn.functional.embedding(x.long(), self.table)


@pytest.fixture
def manager(tmp_path):
    import pynvml

    unit = discover_units(pynvml)[0]
    mgr = GPUManager([unit], ModelStore(tmp_path / "store"), nvml=pynvml)
    yield mgr, unit, pynvml
    mgr.close()


def _nvml_mb(nvml, unit, pid: int) -> float | None:
    nvml.nvmlInit()
    try:
        return nvml_process_mb(nvml, unit_handle(nvml, unit.index, unit.id), pid)
    finally:
        nvml.nvmlShutdown()


def test_the_charged_cost_is_within_10_percent_of_nvmls_per_process_figure(manager):
    mgr, unit, nvml = manager
    digest = mgr.store.put(torchscript_bytes(Wide().eval())).digest
    for rows in (1, 256, 4096):  # the cost follows the batch's activations
        result = mgr.run(digest, unit.id, encode(torch.randn(rows, 2048)))
        assert decode(result.payload).shape == (rows, 2048)
        pid = mgr.workers[(digest, unit.id)].proc.pid
        used = _nvml_mb(nvml, unit, pid)
        if used is None:
            pytest.skip("NVML does not report this process's memory here (a pid namespace or MPS)")
        charged = mgr.status()[0]["model_mb"][digest]
        assert abs(charged - used) <= 0.10 * used, (rows, charged, used)
    assert charged > mgr.model_mb(mgr.store.get(digest))  # the context counts: more than the file


def test_a_device_fault_replaces_the_worker_and_is_not_an_input_error(manager):
    mgr, unit, _ = manager
    digest = mgr.store.put(torchscript_bytes(Lookup().eval())).digest
    good = encode(torch.tensor([1.0, 2.0]))
    mgr.run(digest, unit.id, good)
    first = mgr.workers[(digest, unit.id)]
    with pytest.raises(DeviceFault):
        mgr.run(digest, unit.id, encode(torch.tensor([1000.0])))  # device-side assert, twice
    assert not first.alive
    assert decode(mgr.run(digest, unit.id, good).payload).shape == (2, 8)  # a fresh worker serves


def test_the_mps_client_cap_reads_the_real_units_profiles():
    """Finding 5 on the real device: each unit's worker cap under MPS comes from the profile in
    NVML's own MIG device name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> 6 of 48), a whole GPU's is 48."""
    import pynvml

    from gpu_manager.manager import MPS_MAX_CLIENTS, mps_client_cap

    for unit in discover_units(pynvml):
        cap = mps_client_cap(unit)
        if unit.kind == "mig":
            slices = int(unit.profile.split("g.", 1)[0])
            assert 1 <= slices <= 7, unit.name
            assert cap == max(1, MPS_MAX_CLIENTS * slices // 7), (unit.name, cap)
        else:
            assert cap == MPS_MAX_CLIENTS, (unit.name, cap)
