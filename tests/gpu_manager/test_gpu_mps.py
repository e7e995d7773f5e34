"""MPS on the GPU Manager's units, faked at the subprocess boundary (no nvidia-cuda-mps-control here)."""

from __future__ import annotations

import io
import os
import stat

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager import mig
from gpu_manager.discovery import discover_units
from gpu_manager.manager import GPUManager
from gpu_manager.mps import CONTROL, MPSControl, MPSDaemon, MPSError, RunResult, subprocess_runner
from gpu_manager.worker import Worker
from tests.fake_nvml import FakeGPU, MigNVML
from tests.fake_worker import FakeWorker, stored_program


class FakeRunner:
    """Records each command (argv, the MPS part of its env, its stdin); answers `reply`."""

    def __init__(self, events: list | None = None):
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []
        self.events = events if events is not None else []
        self.reply = RunResult(0)

    def __call__(self, argv, env, input=None):
        mine = {k: v for k, v in env.items() if k.startswith("CUDA_")}
        self.calls.append((argv, mine, input))
        self.events.append(("mps", mine.get("CUDA_VISIBLE_DEVICES"), input or " ".join(argv[1:])))
        return self.reply


MIG_A = "MIG-11111111-2222-3333-4444-555555555555"
MIG_B = "MIG-66666666-7777-8888-9999-000000000000"


def test_a_daemon_per_unit_with_its_own_pipe_and_log_directories(tmp_path):
    runner = FakeRunner()
    control = MPSControl(tmp_path / "mps", runner)
    a, b = control.ensure(MIG_A), control.ensure(MIG_B)
    assert control.ensure(MIG_A) is a and len(runner.calls) == 2  # started once
    (argv_a, env_a, stdin_a), (_, env_b, _) = runner.calls
    assert argv_a == [CONTROL, "-d"] and stdin_a is None
    assert env_a == {
        "CUDA_VISIBLE_DEVICES": MIG_A,
        "CUDA_MPS_PIPE_DIRECTORY": str(a.pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(a.log_dir),
    }
    assert (
        env_b["CUDA_VISIBLE_DEVICES"] == MIG_B and env_b["CUDA_MPS_PIPE_DIRECTORY"] != env_a["CUDA_MPS_PIPE_DIRECTORY"]
    )
    for d in (a.pipe_dir, a.log_dir, b.pipe_dir, b.log_dir):
        assert d.is_dir() and d.is_relative_to(tmp_path / "mps") and stat.S_IMODE(d.stat().st_mode) == 0o700
    assert (a.dir / "unit").read_text().strip() == MIG_A
    assert len(str(a.pipe_dir)) < len(str(tmp_path)) + 30  # short: sockets live in there

    control.stop_all()
    quits = runner.calls[2:]
    assert sorted(c[1]["CUDA_MPS_PIPE_DIRECTORY"] for c in quits) == sorted([str(a.pipe_dir), str(b.pipe_dir)])
    assert all(argv == [CONTROL] and stdin == "quit\n" for argv, _, stdin in quits)  # echo quit | …
    assert control.daemons == {} and not a.running


def test_a_failed_start_is_a_clear_error(tmp_path):
    runner = FakeRunner()
    runner.reply = RunResult(1, "", "An instance of this daemon is already running")
    with pytest.raises(MPSError, match="nvidia-cuda-mps-control -d failed .1.: An instance of this daemon"):
        MPSDaemon(MIG_A, tmp_path, runner).start()


def test_a_stale_daemon_from_a_previous_manager_is_quit_first(tmp_path):
    runner = FakeRunner()
    daemon = MPSDaemon(MIG_A, tmp_path, runner)
    daemon.pipe_dir.mkdir(parents=True)
    (daemon.pipe_dir / "control").touch()
    daemon.start()
    assert [(c[0], c[2]) for c in runner.calls] == [([CONTROL], "quit\n"), ([CONTROL, "-d"], None)]


def test_active_thread_percentage_in_the_env_and_through_the_control_pipe(tmp_path):
    runner = FakeRunner()
    daemon = MPSDaemon(MIG_A, tmp_path, runner)
    assert daemon.client_env(30)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in daemon.client_env()
    daemon.set_active_thread_percentage(4242, 60)
    assert runner.calls[-1][0] == [CONTROL] and runner.calls[-1][2] == "set_active_thread_percentage 4242 60\n"
    for bad in (0, 101, -5):
        with pytest.raises(ValueError, match="1..100"):
            daemon.client_env(bad)
        with pytest.raises(ValueError, match="1..100"):
            daemon.set_active_thread_percentage(4242, bad)
    assert len(runner.calls) == 1
    runner.reply = RunResult(0, "4242\n4343\n")
    assert daemon.servers() == [4242, 4343]


def test_the_real_runner_runs_a_process_and_names_a_missing_program():
    r = subprocess_runner(["sh", "-c", "cat; echo oops >&2; exit 3"], dict(os.environ), "quit\n")
    assert r == RunResult(3, "quit\n", "oops\n")
    with pytest.raises(MPSError, match="is not installed"):
        subprocess_runner(["/nonexistent/nvidia-cuda-mps-control", "-d"], dict(os.environ))


# -- the manager's workers on MPS -----------------------------------------------------------


@pytest.fixture
def mps_node(tmp_path):
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("4g.20gb", 0), ("3g.20gb", 4)])
    events: list = []
    runner = FakeRunner(events)
    store = ModelStore(tmp_path / "models")
    made: list[FakeWorker] = []

    def factory(artifact, device, env=None):
        made.append(FakeWorker(artifact, device, env))
        return made[-1]

    mps = MPSControl(tmp_path / "mps", runner)
    mgr = GPUManager(discover_units(nvml), store, worker_factory=factory, nvml=nvml, mps=mps, mps_thread_percentage=50)
    yield mgr, nvml, gpu, runner, events, store, made, mps
    mgr.close()


def test_workers_join_their_units_mps_daemon_with_their_share(mps_node):
    mgr, _, _, runner, _, store, made, mps = mps_node
    units = sorted(mgr.units)
    m1, m2 = stored_program(store, "m1"), stored_program(store, "m2")
    mgr.set_active_thread_percentage(m2, 30)
    mgr.run(m1, units[0], b"x")
    mgr.run(m2, units[0], b"x")
    mgr.run(m1, units[1], b"x")
    daemon = mps.daemons[units[0]]
    assert made[0].device == "cuda:0"
    assert made[0].env == {
        "CUDA_VISIBLE_DEVICES": units[0],
        "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",  # the manager's default share
    }
    assert made[1].env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"  # this model's own share
    assert made[2].env["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.daemons[units[1]].pipe_dir) != str(daemon.pipe_dir)
    assert [c[0] for c in runner.calls] == [[CONTROL, "-d"], [CONTROL, "-d"]]  # one daemon per unit
    mgr.close()
    assert sorted(c[1]["CUDA_VISIBLE_DEVICES"] for c in runner.calls[2:]) == units  # each one quit
    assert all(c[2] == "quit\n" for c in runner.calls[2:]) and mps.daemons == {}


def test_start_mps_starts_every_cuda_units_daemon(mps_node):
    mgr, _, _, runner, _, _, _, mps = mps_node
    mgr.start_mps()
    assert sorted(mps.daemons) == sorted(mgr.units) and len(runner.calls) == 2


def test_a_reconfiguration_stops_the_units_daemons_before_nvml_destroys_them(mps_node):
    mgr, nvml, gpu, runner, events, store, _, mps = mps_node
    mgr.start_mps()
    three_g = next(u for u in mgr.units if mgr.units[u].info.name.endswith("3g.20gb"))
    nvml.log = events  # one timeline for both
    out = mgr.reconfigure(0, ["4g.20gb", "2g.10gb", "1g.5gb"])
    quit_at = next(i for i, e in enumerate(events) if e[0] == "mps" and e[1] == three_g and e[2] == "quit\n")
    destroy_at = next(i for i, e in enumerate(events) if e[0] == "destroy_ci")
    assert quit_at < destroy_at
    assert three_g not in mps.daemons and gpu.geometry() == ["4g.20gb", "2g.10gb", "1g.5gb"]
    new = next(u["unit"] for u in out["units"] if u["name"].endswith("1g.5gb"))
    mgr.run(stored_program(store, "m"), new, b"x")  # the new unit gets its own daemon on first use
    assert mps.daemons[new].running


def test_without_mps_a_cuda_worker_only_sees_its_unit(tmp_path):
    gpu = FakeGPU.a100_40gb()
    nvml = MigNVML([gpu])
    nvml.preset(gpu, [("7g.40gb", 0)])
    made = []
    store = ModelStore(tmp_path)
    mgr = GPUManager(
        discover_units(nvml),
        store,
        worker_factory=lambda a, d, env=None: made.append(FakeWorker(a, d, env)) or made[-1],
    )
    (unit,) = mgr.units
    mgr.run(stored_program(store, "m"), unit, b"x")
    assert made[0].env == {"CUDA_VISIBLE_DEVICES": unit} and made[0].device == "cuda:0"
    assert mig.describe_gpus(nvml)[0]["geometry"] == ["7g.40gb"]
    mgr.close()


class Doubles(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_a_real_worker_process_gets_the_env_before_cuda_starts(tmp_path):
    """The env goes to the worker process, which applies it before it imports torch. (A model
    that read os.environ in forward was a pickle; TorchScript and torch.export cannot read it.)"""
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Doubles()), buf)
    artifact = ModelStore(tmp_path).put(buf.getvalue())
    worker = Worker(artifact, "cpu", env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"})
    worker.start()
    try:
        assert worker.env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}  # what _serve applies first
        assert decode(worker.run(encode(torch.ones(2)))).tolist() == [2.0, 2.0]
    finally:
        worker.stop()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ  # only the worker's own environment
