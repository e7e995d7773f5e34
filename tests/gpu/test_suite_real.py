"""The GPU suite's own checks on the real device (H4): profile-colocation's device choice, MPS daemon
and SM baseline (finding 10), and the gpu_check benchmark's read-only parts. Read-only: MPS is
started with its own pipe and log folders and stopped; nothing else on the device changes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from faas_gpu.mps import MPSSession
from faas_gpu.paths import REPO_ROOT
from faas_gpu.profiling.colocation_runner import Device, Workload, co_located_times, worker_env
from tests.module_files import registered


def _nvml_first() -> tuple[str, str, bool]:
    """(UUID where CUDA work runs, GPU name, MIG on) of NVML's GPU 0."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        try:
            mig = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError:
            mig = False
        if mig:
            for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    h = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    break
                except pynvml.NVMLError:
                    continue
        uuid = pynvml.nvmlDeviceGetUUID(h)
    finally:
        pynvml.nvmlShutdown()
    return _text(uuid), _text(name), mig


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def test_an_nvml_index_is_the_same_gpu_for_cuda():
    """NVML's index 0 becomes its UUID, and a process given it sees that very GPU."""
    uuid, _, _ = _nvml_first()
    device = Device.parse("cuda:0").by_uuid()
    assert device.visible and device.visible.startswith(("GPU-", "MIG-"))
    probe = "import torch; print(torch.cuda.get_device_properties(0).uuid)"
    done = subprocess.run([sys.executable, "-c", probe], env=worker_env(device), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if device.visible.startswith("GPU-"):
        assert done.stdout.strip() in device.visible


def test_mps_serves_a_client_and_stops():
    uuid, _, _ = _nvml_first()
    with MPSSession(uuid) as mps:
        env = mps.client_env()
        code = "import torch; x = torch.ones(256, 256, device='cuda'); print(float((x @ x).sum()))"
        done = subprocess.run([sys.executable, "-c", code], env={**worker_env(Device.parse(uuid)), **env},
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [t for t in mps.control("get_server_list").split() if t.isdigit()], "no MPS server came up"
        pipe = mps.pipe_dir
    assert not mps.running and not pipe.exists()


def test_co_runners_share_the_gpu_under_mps_and_report_its_sms():
    uuid, _, _ = _nvml_first()
    device = Device.parse(uuid)
    w = Workload("faas_gpu.profiling.examples:textcnn", (64,), 64, "int64")
    solo = co_located_times(w, device, 0, repeat=3, warmup=1, cwd=REPO_ROOT)
    assert solo.sms and solo.sms > 0 and len(solo.times_s) == 3
    with MPSSession(uuid) as mps:
        run = co_located_times(w, device, 1, repeat=3, warmup=1, cwd=REPO_ROOT, env=mps.client_env())
    assert len(run.times_s) == 3 and all(t > 0 for t in run.times_s)


def test_the_7g_baseline_sms_come_from_nvml_or_the_table():
    from faas_gpu.policy_data.protean import gpu_model
    from faas_gpu.profiling.colocation_cli import seven_g_sms

    _, name, _ = _nvml_first()
    table = "A100-40GB" if "A100" in name else "H100-80GB"
    sms, source = seven_g_sms(gpu_model(table), name)
    assert sms and sms > 0 and source


@pytest.fixture(scope="module")
def gpu_check():
    with registered("gpu_check", REPO_ROOT / "benchmarks" / "gpu_check.py") as module:
        yield module


def test_gpu_check_reads_the_device_and_its_copy_bandwidth(gpu_check, tmp_path):
    ctx = gpu_check.Context(tmp_path)
    found = gpu_check.discovery_part(ctx)
    assert found["driver"] and found["units"] and found["cuda_device"].startswith(("GPU-", "MIG-"))
    bw = gpu_check.h2d_part(ctx, mib=64, repeat=2)
    assert bw["h2d_pinned_gb_s"] > 1.0
