"""MIG, MPS and memory figures on the real device (issue 19, findings 2, 6, 7, 8), read-only.

Nothing here changes MIG mode or geometry, compute mode, clocks or persistence: the privilege
probe is read from the OS, memory and process lists from NVML, and the one MPS control daemon
started lives in its own pipe and log directories under a temporary directory (only processes
given that pipe directory join it) and is stopped before the test ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpu_manager import mig
from gpu_manager.discovery import discover_units, memory_info
from gpu_manager.mps import MPSDaemon, control_daemon_pid, pid_alive


@pytest.fixture
def nvml():
    import pynvml

    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def _handles(nvml) -> list[tuple[str, object, bool]]:
    """(uuid, handle, is a MIG device) of every unit NVML shows: whole GPUs and MIG devices."""
    out = []
    for index in range(nvml.nvmlDeviceGetCount()):
        dev = nvml.nvmlDeviceGetHandleByIndex(index)
        if mig.mig_mode(nvml, dev) != "enabled":
            out.append((nvml.nvmlDeviceGetUUID(dev), dev, False))
            continue
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(dev)):
            try:
                m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev, slot)
            except nvml.NVMLError:
                continue
            out.append((nvml.nvmlDeviceGetUUID(m), m, True))
    return [(u.decode() if isinstance(u, bytes) else u, h, is_mig) for u, h, is_mig in out]


def test_the_privilege_probe_answers_and_get_gpus_reads_without_500():
    """Finding 2: the probe's answer (logged by the manager at start), and describe_gpus (GET
    /v1/gpus) reading every GPU, the parent's memory of a MIG-mode GPU None where it is privileged."""
    import pynvml

    privilege = mig.probe_privilege()
    print(f"MIG geometry control: {privilege.allowed} ({privilege.reason})")
    assert privilege.reason
    gpus = mig.describe_gpus(pynvml)
    assert gpus, "NVML sees GPUs, describe_gpus none"
    for g in gpus:
        assert g["memory_mb"] is None or g["memory_mb"] > 0
        if g["memory_mb"] is None:
            assert g["mig_mode"] == "enabled"


def test_v2_memory_is_consistent_with_v1_and_sizes_the_units(nvml):
    """Finding 7: usable = v2 total - reserved <= v1 total; both see the same free memory (within
    what other processes change between the two calls); discovery sizes units by the v2 figure."""
    units = {u.id: u for u in discover_units(nvml)}  # its own session, nested in the fixture's
    for uuid, handle, _is_mig in _handles(nvml):
        v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
        mem = memory_info(nvml, handle)
        print(
            f"{uuid}: v{mem.version} usable {mem.total / 2**20:.0f} MiB, reserved {mem.reserved / 2**20:.0f} MiB, "
            f"v1 total {v1.total / 2**20:.0f} MiB"
        )
        assert 0 < mem.total <= v1.total
        if mem.version == 2:
            assert mem.total + mem.reserved == pytest.approx(v1.total, rel=0.01)
        assert units[uuid].memory_mb == pytest.approx(mem.total / 2**20, rel=0.001)


def test_both_process_lists_are_readable(nvml):
    """Finding 6: what destroying an instance relies on. NO_PERMISSION here would make the manager
    refuse every reconfiguration (403); NOT_SUPPORTED for the MPS list is an old driver's."""
    for uuid, handle, _is_mig in _handles(nvml):
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        try:
            mps_clients = nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)
        except nvml.NVMLError_NotSupported:
            mps_clients = None
        print(f"{uuid}: {len(procs)} compute processes, MPS clients {mps_clients and len(mps_clients)}")
        assert all(p.pid > 0 for p in procs)


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="no nvidia-cuda-mps-control")
@pytest.mark.timeout(180)
def test_an_mps_daemon_starts_answers_serves_a_client_and_is_gone_after_stop(nvml):
    """Finding 8: -d, then get_server_list answers (no server before a client); a CUDA client
    through our pipe directory starts a server; stop ends the control daemon and its server."""
    uuid = _handles(nvml)[0][0]
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # short: sockets live under it
    daemon = MPSDaemon(uuid, root)
    try:
        daemon.start()
        assert daemon.running and daemon.answering
        assert daemon.pid is not None and daemon.pid == control_daemon_pid(daemon.pipe_dir)
        assert daemon.servers() == []  # the server starts at the first client
        client = subprocess.run(
            [sys.executable, "-c", "import torch; x = torch.ones(1, device='cuda'); print((x * 2).item())"],
            env={**os.environ, **daemon.client_env(50)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert client.returncode == 0 and client.stdout.strip() == "2.0", client.stderr
        servers = daemon.servers()
        print(f"MPS control daemon pid {daemon.pid}, servers {servers}")
        assert len(servers) == 1
        pid = daemon.pid
        daemon.stop()
        assert not daemon.running
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in (pid, *servers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid) and not any(pid_alive(p) for p in servers)
    finally:
        if daemon.running:
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
