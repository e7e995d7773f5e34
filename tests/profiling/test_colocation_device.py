"""Finding 10: co-location profiling on a real GPU, with fakes at the NVML and subprocess boundaries.

MPS daemon of the run's own (co-runners share SMs instead of time-slicing), the 7g baseline on a
whole GPU with more SMs than the 7g profile (A100: 108 vs 98), and devices chosen by UUID, as CUDA
numbers devices in another order than NVML.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from faas_gpu.policy_data.protean import gpu_model
from faas_gpu.profiling import colocation_cli
from faas_gpu.profiling.colocation_runner import Device, Run, worker_env
from faas_gpu.profiling.mps_session import CONTROL, MPSError, MPSSession
from tests.fake_nvml import FakeGPU, MigNVML


# -- the MPS daemon ----------------------------------------------------------------------------------
class FakeControl:
    """nvidia-cuda-mps-control: `-d` makes the control pipe, `quit` removes it (unless stuck)."""

    def __init__(self, start_rc: int = 0, stuck: int = 0) -> None:
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []
        self.start_rc, self.stuck = start_rc, stuck

    def __call__(self, argv: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[int, str]:
        self.calls.append((argv, env, stdin))
        pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
        if argv == [CONTROL, "-d"]:
            if self.start_rc:
                return self.start_rc, "An instance of this daemon is already running"
            (pipe / "control").write_text("")
            return 0, ""
        if self.stuck > 0:
            self.stuck -= 1
            return 0, ""
        (pipe / "control").unlink(missing_ok=True)
        return 0, ""


def test_mps_starts_with_its_own_pipe_and_log_folders_and_stops(tmp_path):
    control = FakeControl()
    with MPSSession("GPU-abc", root=tmp_path, runner=control) as mps:
        env = mps.client_env()
        pipe, log = Path(env["CUDA_MPS_PIPE_DIRECTORY"]), Path(env["CUDA_MPS_LOG_DIRECTORY"])
        assert pipe.is_dir() and log.is_dir() and pipe.parent.parent == tmp_path
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-abc"
        argv, daemon_env, _ = control.calls[0]
        assert argv == [CONTROL, "-d"] and daemon_env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert [c[2] for c in control.calls[1:]] == ["quit\n"]
    assert not mps.running and not pipe.exists()


def test_mps_is_stopped_when_the_measurement_fails(tmp_path):
    control = FakeControl()
    with pytest.raises(RuntimeError, match="boom"), MPSSession(None, root=tmp_path, runner=control) as mps:
        raise RuntimeError("boom")
    assert control.calls[-1][2] == "quit\n" and not mps.running
    assert "CUDA_VISIBLE_DEVICES" not in mps.client_env()


def test_a_daemon_that_does_not_quit_is_terminated_then_named(tmp_path):
    control = FakeControl(stuck=1)
    with MPSSession("GPU-abc", root=tmp_path, runner=control, stop_wait_s=0.05):
        pass
    assert [c[2] for c in control.calls[1:]] == ["quit\n", "quit -t 5\n"]
    stuck = FakeControl(stuck=5)
    with (
        pytest.raises(MPSError, match="did not stop"),
        MPSSession("GPU-x", root=tmp_path, runner=stuck, stop_wait_s=0.05),
    ):
        pass


def test_a_daemon_that_does_not_start_is_an_error_and_leaves_nothing(tmp_path):
    with pytest.raises(MPSError, match="already running"):
        MPSSession("GPU-abc", root=tmp_path, runner=FakeControl(start_rc=1)).start()
    assert list(tmp_path.iterdir()) == []


# -- devices by UUID ----------------------------------------------------------------------------------
def test_an_nvml_index_runs_by_its_uuid():
    gpus = [FakeGPU.h100_80gb(mig=False), FakeGPU.h100_80gb(mig=False)]
    nvml = MigNVML(gpus)
    assert Device.parse("cuda:1").by_uuid(nvml).visible == gpus[1].uuid
    assert Device.parse("1").by_uuid(nvml).visible == gpus[1].uuid
    assert nvml.inits == 0  # shut down again
    assert Device.parse("MIG-x").by_uuid(nvml).visible == "MIG-x"
    assert Device.parse("cpu:2").by_uuid(nvml) == Device.parse("cpu:2")
    # no driver: the index stays, and the worker counts devices in NVML's (PCI) order
    kept = Device.parse("cuda:1").by_uuid(MigNVML(gpus, driver=False))
    assert kept.visible == "1"
    env = worker_env(kept, {"CUDA_MPS_PIPE_DIRECTORY": "/p"})
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/p"
    assert worker_env(Device.parse("cpu:1"))["CUDA_VISIBLE_DEVICES"] == ""  # threads: no GPU seen


# -- the 7g baseline --------------------------------------------------------------------------------
def _plan(gpu: str, spec: str) -> dict:
    return {"gpu": gpu_model(gpu), "devices": {"7g": Device.parse(spec)}}


def test_a_whole_a100_is_scaled_to_the_7g_profiles_sms_from_nvml():
    nvml = MigNVML([FakeGPU.a100_40gb(mig=False), FakeGPU.a100_40gb(mig=True)])
    runs = {"7g": Run([0.010, 0.010, 0.010], "NVIDIA A100-SXM4-40GB", 108)}
    base, note = colocation_cli.whole_baseline_s(_plan("A100-40GB", "GPU-a"), runs, nvml)
    assert base == pytest.approx(0.010 * 108 / 98)
    assert "108 SMs scaled to 98" in note and "NVML" in note and "GPU 1" in note


def test_without_a_mig_enabled_gpu_the_package_table_gives_the_7g_sms():
    runs = {"7g": Run([0.010], "NVIDIA A100-SXM4-40GB", 108)}
    base, note = colocation_cli.whole_baseline_s(_plan("A100-40GB", "GPU-a"), runs, MigNVML([], driver=False))
    assert base == pytest.approx(0.010 * 108 / 98) and "package" in note


@pytest.mark.parametrize(
    ("gpu", "spec", "sms"),
    [
        ("A100-40GB", "MIG-7g", 98),  # a 7g slice is the baseline itself
        ("A100-40GB", "cpu:2", None),  # threads: nothing to scale
        ("H100-80GB", "GPU-h", 132),  # the whole H100 has the 7g profile's SMs
    ],
)
def test_no_scaling_where_the_baseline_is_already_7g(gpu, spec, sms):
    runs = {"7g": Run([0.02], "NVIDIA H100 80GB HBM3", sms)}
    assert colocation_cli.whole_baseline_s(_plan(gpu, spec), runs, MigNVML([], driver=False)) == (0.02, None)


# -- the CLI's co-location curve under MPS -------------------------------------------------------------
MODEL = textwrap.dedent(
    """
    from torch import nn

    def make():
        return nn.Linear(4, 2)
    """
)


@pytest.fixture
def fake_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    calls: list[tuple[int, dict | None]] = []

    def times(w, device, k, *, env=None, **kw):
        calls.append((k, env))
        return Run([0.010 * (1 + 0.5 * k)] * 3, "NVIDIA A100-SXM4-40GB", 108)

    sessions: list[MPSSession] = []

    class Session(MPSSession):
        def __init__(self, device):
            super().__init__(device, root=tmp_path, runner=FakeControl())
            sessions.append(self)

    monkeypatch.setattr(colocation_cli, "co_located_times", times)
    monkeypatch.setattr(colocation_cli, "MPSSession", Session)
    monkeypatch.setattr(colocation_cli, "seven_g_sms", lambda gpu, name, nvml=None: (98, "test"))
    return calls, sessions


ARGS = ["--model", "model.py:make", "--input-shape", "4", "--batch", "2", "--name", "resnet50"]


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    colocation_cli.add_parser(p.add_subparsers(dest="command"))
    return colocation_cli.run(p.parse_args(["profile-colocation", *argv]))


def test_the_gpu_curve_runs_under_its_own_mps_daemon(fake_runs, capsys):
    calls, sessions = fake_runs
    assert _run([*ARGS, "--devices", "7g=GPU-a,1g=MIG-b", "--max-corunners", "2"]) == 0
    err = capsys.readouterr().err
    assert len(sessions) == 1 and sessions[0].device == "GPU-a" and not sessions[0].running
    solo, curve = calls[:2], calls[2:]
    assert [k for k, env in solo] == [0, 0] and all(env is None for _, env in solo)  # RDF solo runs
    assert [k for k, _ in curve] == [0, 1, 2]  # T_0 again, under the same daemon
    assert all(env and "CUDA_MPS_PIPE_DIRECTORY" in env for _, env in curve)
    assert "108 SMs scaled to 98" in err and "MPS daemon" in err


def test_no_mps_time_slices_and_cpu_never_starts_a_daemon(fake_runs):
    calls, sessions = fake_runs
    assert _run([*ARGS, "--devices", "7g=GPU-a", "--max-corunners", "1", "--no-mps"]) == 0
    assert _run([*ARGS, "--devices", "7g=cpu:1", "--max-corunners", "1"]) == 0
    assert sessions == [] and all(env is None for _, env in calls)


def test_a_daemon_that_does_not_start_is_exit_1_naming_it(fake_runs, monkeypatch, capsys):
    class Broken(MPSSession):
        def __init__(self, device):
            super().__init__(device, runner=FakeControl(start_rc=1))

    monkeypatch.setattr(colocation_cli, "MPSSession", Broken)
    assert _run([*ARGS, "--devices", "7g=GPU-a", "--max-corunners", "1"]) == 1
    assert "already running" in capsys.readouterr().err
