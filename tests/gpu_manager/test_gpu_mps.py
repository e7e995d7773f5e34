"""MPS on the GPU Manager's units, faked at the subprocess boundary (no nvidia-cuda-mps-control here)."""

from __future__ import annotations

import os
import signal
import stat

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from gpu_manager import mig
from gpu_manager.discovery import discover_units
from gpu_manager.manager import GPUManager
from gpu_manager.mps import (
    CONTROL,
    PID_FILE,
    MPSControl,
    MPSDaemon,
    MPSError,
    Processes,
    RunResult,
    Timeouts,
    control_daemon_pid,
    subprocess_runner,
)
from gpu_manager.worker import Worker
from tests.fake_nvml import FakeGPU, MigNVML
from tests.fake_worker import FakeWorker, stored_program
from tests.torchscript import torchscript_bytes


class FakeRunner:
    """nvidia-cuda-mps-control faked at the subprocess boundary, per pipe directory as the real one:
    `-d` starts a control daemon; a command through the pipe reaches it only while it runs (else it
    fails as the client does when no daemon answers); `quit` ends it unless `stubborn` (clients that
    do not exit: `quit -t` ends it unless `stubborn == "always"`); `silent` pipes never answer.
    `reply`, when set, answers every command instead. Records each command (argv, the MPS part of
    its env, its stdin) in `calls` and `events`."""

    def __init__(self, events: list | None = None):
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []
        self.events = events if events is not None else []
        self.reply: RunResult | None = None
        self.up: set[str] = set()  # pipe directories with a control daemon
        self.servers = ""  # get_server_list's answer
        self.stubborn: bool | str = False
        self.silent = False

    def __call__(self, argv, env, input=None):
        mine = {k: v for k, v in env.items() if k.startswith("CUDA_")}
        self.calls.append((argv, mine, input))
        self.events.append(("mps", mine.get("CUDA_VISIBLE_DEVICES"), input or " ".join(argv[1:])))
        if self.reply is not None:
            return self.reply
        pipe = mine["CUDA_MPS_PIPE_DIRECTORY"]
        if argv[1:] == ["-d"]:
            if pipe in self.up:
                return RunResult(1, "", "An instance of this daemon is already running")
            self.up.add(pipe)
            return RunResult(0)
        if pipe not in self.up or self.silent:
            return RunResult(1, "", "Cannot find MPS control daemon process")
        command = (input or "").strip()
        if command == "quit" and not self.stubborn or command.startswith("quit -t") and self.stubborn != "always":
            self.up.discard(pipe)
        return RunResult(0, self.servers + "\n" if command == "get_server_list" else "")

    def commands(self) -> list[str]:
        return [c[2].strip() if c[2] else " ".join(c[0][1:]) for c in self.calls]


NO_PIDS = Processes(find=lambda _pipe: None)  # these tests' daemons are the fake's: no pid in /proc


MIG_A = "MIG-11111111-2222-3333-4444-555555555555"
MIG_B = "MIG-66666666-7777-8888-9999-000000000000"


def test_a_daemon_per_unit_with_its_own_pipe_and_log_directories(tmp_path):
    runner = FakeRunner()
    control = MPSControl(tmp_path / "mps", runner, NO_PIDS)
    a, b = control.ensure(MIG_A), control.ensure(MIG_B)
    assert control.ensure(MIG_A) is a and runner.commands() == ["-d", "get_server_list"] * 2  # started once
    (argv_a, env_a, stdin_a), (_, env_b, _) = [c for c in runner.calls if c[0][1:] == ["-d"]]
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
    quits = [c for c in runner.calls if c[2] == "quit\n"]
    assert sorted(c[1]["CUDA_MPS_PIPE_DIRECTORY"] for c in quits) == sorted([str(a.pipe_dir), str(b.pipe_dir)])
    assert all(argv == [CONTROL] for argv, _, _ in quits)  # echo quit | …
    assert control.daemons == {} and not a.running and runner.up == set()


def test_a_failed_start_is_a_clear_error(tmp_path):
    runner = FakeRunner()
    runner.reply = RunResult(1, "", "An instance of this daemon is already running")
    with pytest.raises(MPSError, match="nvidia-cuda-mps-control -d failed .1.: An instance of this daemon"):
        MPSDaemon(MIG_A, tmp_path, runner).start()


def test_a_stale_daemon_from_a_previous_manager_is_quit_first(tmp_path):
    runner = FakeRunner()
    daemon = MPSDaemon(MIG_A, tmp_path, runner, NO_PIDS)
    daemon.pipe_dir.mkdir(parents=True)
    (daemon.pipe_dir / "control").touch()
    runner.up.add(str(daemon.pipe_dir))
    daemon.start()
    assert runner.commands() == ["get_server_list", "quit", "get_server_list", "-d", "get_server_list"]
    assert daemon.running and daemon.answering
    (daemon.pipe_dir / "control").unlink()
    daemon.stop()
    (daemon.pipe_dir / "control").touch()  # a socket left over, no daemon behind it
    runner.calls.clear()
    daemon.start()
    assert runner.commands() == ["get_server_list", "quit", "get_server_list", "-d", "get_server_list"]


def test_active_thread_percentage_in_the_env_and_through_the_control_pipe(tmp_path):
    runner = FakeRunner()
    daemon = MPSDaemon(MIG_A, tmp_path, runner, NO_PIDS)
    runner.up.add(str(daemon.pipe_dir))
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
    runner.servers = "4242\n4343"
    assert daemon.servers() == [4242, 4343]


def test_the_real_runner_runs_a_process_and_names_a_missing_program():
    r = subprocess_runner(["sh", "-c", "cat; echo oops >&2; exit 3"], dict(os.environ), "quit\n")
    assert r == RunResult(3, "quit\n", "oops\n")
    with pytest.raises(MPSError, match="is not installed"):
        subprocess_runner(["/nonexistent/nvidia-cuda-mps-control", "-d"], dict(os.environ))


# -- the daemon's lifecycle: started is not answering, quit is not gone ----------------------

FAST = Timeouts(answer_s=0.05, quit_wait_s=0.01, quit_timeout_s=0.02, kill_wait_s=0.01, poll_s=0.001)


class FakePids(Processes):
    """The control daemon as a process: pid 777 lives while the fake runner's daemon is up;
    a signal ends it (and its servers) unless `unkillable`."""

    def __init__(self, runner: FakeRunner, pipe_dir):
        super().__init__(find=lambda _pipe: 777, alive=self._alive, kill=self._kill, sleep=lambda _s: None)
        self.runner, self.pipe, self.unkillable = runner, str(pipe_dir), False
        self.signals: list[tuple[int, int]] = []

    def _alive(self, pid: int) -> bool:
        return self.pipe in self.runner.up

    def _kill(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))
        if pid == 777 and not self.unkillable:
            self.runner.up.discard(self.pipe)


def _daemon(tmp_path, runner):
    pids = FakePids(runner, MPSDaemon(MIG_A, tmp_path).pipe_dir)
    return MPSControl(tmp_path, runner, pids, FAST), pids


def test_started_means_its_control_pipe_answers_not_only_that_d_exited_0(tmp_path):
    runner = FakeRunner()
    control, pids = _daemon(tmp_path, runner)
    daemon = control.ensure(MIG_A)
    assert daemon.running and daemon.answering and daemon.pid == 777
    assert runner.commands() == ["-d", "get_server_list"]  # no server yet: none runs before a client
    assert daemon.servers() == []

    runner2 = FakeRunner()
    runner2.silent = True  # -d exits 0, the pipe never answers
    control2, pids2 = _daemon(tmp_path / "2", runner2)
    with pytest.raises(MPSError, match="started .* but its control pipe does not answer get_server_list"):
        control2.ensure(MIG_A)
    assert (777, signal.SIGTERM) in pids2.signals  # ended by pid, not left running unanswered
    assert control2.daemons == {} and runner2.up == set()


def test_stop_escalates_quit_then_quit_t_then_signals_by_pid(tmp_path):
    runner = FakeRunner()
    control, pids = _daemon(tmp_path, runner)
    control.ensure(MIG_A)
    runner.stubborn = True  # clients that do not exit: plain quit waits for them
    control.stop(MIG_A)
    assert runner.commands()[2:] == ["get_server_list", "quit", "quit -t 0.02"] and pids.signals == []
    assert control.daemons == {}

    control.ensure(MIG_A)
    runner.stubborn, runner.servers = "always", "4242"
    control.stop(MIG_A)
    assert runner.commands()[-2:] == ["quit", "quit -t 0.02"]
    assert pids.signals == [(4242, signal.SIGTERM), (777, signal.SIGTERM)]  # its server too
    assert control.daemons == {} and runner.up == set()


def test_a_daemon_that_will_not_go_stays_tracked_and_is_stopped_again(tmp_path):
    runner = FakeRunner()
    control, pids = _daemon(tmp_path, runner)
    daemon = control.ensure(MIG_A)
    runner.stubborn, pids.unkillable = "always", True
    control.stop(MIG_A)  # logged, not raised: the manager's shutdown goes on
    assert [sig for _pid, sig in pids.signals] == [signal.SIGTERM, signal.SIGKILL]
    assert control.daemons == {MIG_A: daemon} and daemon.running  # not forgotten
    with pytest.raises(MPSError, match="still there after quit, quit -t 0.02, SIGTERM, SIGKILL; still tracked"):
        daemon.stop()
    pids.unkillable = False
    control.stop_all()
    assert control.daemons == {} and not daemon.running and daemon.pid is None


def test_the_control_daemons_pid_from_its_pid_file_or_from_proc(tmp_path):
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    proc = tmp_path / "proc"
    for pid, argv0, pipe_dir in ((10, "/usr/bin/nvidia-cuda-mps-control", "/elsewhere"), (11, "bash", str(pipe))):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(argv0.encode() + b"\0-d\0")
        (proc / str(pid) / "environ").write_bytes(f"A=1\0CUDA_MPS_PIPE_DIRECTORY={pipe_dir}\0".encode())
    assert control_daemon_pid(pipe, proc) is None  # another daemon's pipes; a shell with ours
    (proc / "12").mkdir()
    (proc / "12" / "cmdline").write_bytes(b"nvidia-cuda-mps-control\0-d\0")
    (proc / "12" / "environ").write_bytes(f"CUDA_MPS_PIPE_DIRECTORY={pipe}\0".encode())
    assert control_daemon_pid(pipe, proc) == 12
    (pipe / PID_FILE).write_text("4711\n")
    assert control_daemon_pid(pipe, proc) == 4711


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

    mps = MPSControl(tmp_path / "mps", runner, NO_PIDS)
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
    assert [c[1]["CUDA_VISIBLE_DEVICES"] for c in runner.calls if c[0][1:] == ["-d"]] == units  # one per unit
    mgr.close()
    assert sorted(c[1]["CUDA_VISIBLE_DEVICES"] for c in runner.calls if c[2] == "quit\n") == units  # each one quit
    assert mps.daemons == {} and runner.up == set()


def test_start_mps_starts_every_cuda_units_daemon(mps_node):
    mgr, _, _, runner, _, _, _, mps = mps_node
    mgr.start_mps()
    assert sorted(mps.daemons) == sorted(mgr.units) and runner.commands().count("-d") == 2


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
    artifact = ModelStore(tmp_path).put(torchscript_bytes(Doubles()))
    worker = Worker(artifact, "cpu", env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"})
    worker.start()
    try:
        assert worker.env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}  # what _serve applies first
        assert decode(worker.run(encode(torch.ones(2)))).tolist() == [2.0, 2.0]
    finally:
        worker.stop()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ  # only the worker's own environment
