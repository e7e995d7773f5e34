"""The GPU Manager's sim back end: profiled timings (INFless profiles), no model run."""

import time

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from faas_gpu.paths import REPO_ROOT
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from gpu_manager.sim_backend import Profile, SimWorker
from gpu_manager.worker import ModelInputError

PROFILE = REPO_ROOT.parent / "shared" / "data" / "infless" / "profiler" / "resnet-50-profile-results.txt"


def test_profile_reads_one_configuration_and_rounds_batches_up():
    p = Profile.from_infless(PROFILE, threads=8, sm_percent=50)
    assert p.batches == [8, 16]  # batch 32 at 8 threads is saturated (>= 9 s) in the profile
    assert p.latency(8) == pytest.approx(0.11488) and p.latency(3) == p.latency(8)
    assert p.latency(16) == pytest.approx(0.16844)
    with pytest.raises(ModelInputError, match="beyond the profile"):
        p.latency(17)


def test_bad_profiles_are_refused(tmp_path):
    bad = tmp_path / "p.txt"
    bad.write_text("resnet-50 2 10 one 60\n")
    with pytest.raises(ValueError, match="p.txt line 1"):
        Profile.from_infless(bad, 2, 10)
    with pytest.raises(ValueError, match="no feasible rows"):
        Profile.from_infless(PROFILE, threads=3, sm_percent=50)


def test_manager_on_the_sim_back_end_takes_the_profiled_time(tmp_path):
    import io

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buf)  # any artifact: the sim back end never loads it
    store = ModelStore(tmp_path)
    digest = store.put(buf.getvalue()).digest
    profile = Profile.from_infless(PROFILE, threads=2, sm_percent=50)
    mgr = GPUManager(cpu_units(1, 64), store, worker_factory=lambda a, d: SimWorker(profile, load_s=0.05))
    t0 = time.perf_counter()
    result = mgr.run(digest, "cpu-0", encode(torch.zeros(1, 3, 224, 224)))
    assert time.perf_counter() - t0 >= 0.052 and not result.hit
    assert decode(result.payload).shape == (1, 1000)
    assert mgr.run(digest, "cpu-0", encode(torch.zeros(2, 3, 224, 224))).hit
