"""`make gpu-check` (benchmarks/gpu_check.py) without a GPU: its refusal, its parts' orchestration
(each failing soft), its report (docs/GPU.md and the JSON line) and the MPS part's clean-up, with
fakes where the GPU would be. The real run is on a GPU machine."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from faas_gpu.mps import MPSSession
from faas_gpu.paths import REPO_ROOT
from tests.fake_mps import NO_PIDS, FakeRunner
from tests.fake_nvml import FakeGPU, MigNVML
from tests.module_files import registered


@pytest.fixture(scope="module")
def bench():
    with registered("gpu_check", REPO_ROOT / "benchmarks" / "gpu_check.py") as module:  # its dataclasses
        yield module


def test_without_a_gpu_it_says_so_writes_nothing_and_exits_2(tmp_path):
    """The real command on this machine (no NVIDIA driver): a skip never reads as a pass."""
    out = tmp_path / "GPU.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "no GPU on this machine" in done.stdout and "not written" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1])["gpu"] is None
    assert not out.exists()


def test_makefile_runs_the_suite_through_the_benchmark():
    make = (REPO_ROOT / "Makefile").read_text()
    assert "gpu-check:" in make and "benchmarks/gpu_check.py" in make


def _fake_parts(calls):
    def discovery(ctx):
        calls.append("discovery")
        return {"device": "NVIDIA H100 80GB HBM3 (81559 MiB, MIG disabled)", "driver": "570.1", "cuda_device": "GPU-1"}

    def broken(ctx):
        calls.append("broken")
        raise RuntimeError("the manager did not start")

    def serving(ctx):
        calls.append("classify")
        assert ctx.figure("discovery", "cuda_device") == "GPU-1"  # later parts read earlier ones
        assert ctx.figure("broken", "anything") is None
        return {"batching_speedup": 3.4, "memory_relative_error": 0.25, "batch": {"rps": 340.0}}

    return [("discovery", discovery), ("broken", broken), ("classify", serving)]


def test_a_failing_part_is_recorded_and_the_rest_still_run(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "gpu_missing", lambda: None)
    calls: list[str] = []
    out = tmp_path / "docs" / "GPU.md"
    assert bench.main(["--out", str(out)], parts=_fake_parts(calls)) == 1
    assert calls == ["discovery", "broken", "classify"]
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["failed_parts"] == ["broken"]
    assert report["parts"]["broken"] == {"ok": False, "error": "RuntimeError: the manager did not start",
                                         "seconds": report["parts"]["broken"]["seconds"]}  # fmt: skip
    assert report["device"].startswith("NVIDIA H100") and report["driver"] == "570.1"
    assert report["goals"]["classify_batching_speedup_ge_3x"] is True
    assert report["goals"]["classify_memory_within_10%"] is False
    assert report["goals"]["embed_batching_speedup_ge_3x"] is None  # not measured
    datetime.datetime.fromisoformat(report["date"])
    md = out.read_text()
    assert "device: NVIDIA H100" in md and "driver: 570.1" in md and report["date"] in md
    assert "## broken" in md and "**Failed**" in md and "the manager did not start" in md
    assert "| batching_speedup | 3.4 |" in md and "| classify_memory_within_10% | NO |" in md


def test_every_part_ok_exits_0_and_only_picks_parts(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "gpu_missing", lambda: None)
    calls: list[str] = []
    parts = [p for p in _fake_parts(calls) if p[0] != "broken"]
    assert bench.main(["--out", str(tmp_path / "GPU.md"), "--only", "discovery"], parts=parts) == 0
    assert calls == ["discovery"]
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "GPU.md"), "--only", "nope"], parts=parts)


def test_sigterm_ends_the_run_through_the_parts_finally_and_keeps_what_was_measured(bench, tmp_path, monkeypatch):
    """A lent machine's time limit sends SIGTERM: the part cleans up, the parts after it do not
    run, and the report still holds what the parts before it measured."""
    monkeypatch.setattr(bench, "gpu_missing", lambda: None)
    cleaned, ran = [], []

    def part(ctx):
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            cleaned.append(True)
        return {}

    before = signal.getsignal(signal.SIGTERM)
    parts = [("discovery", lambda ctx: {"device": "X"}), ("mps", part), ("colocation", lambda ctx: ran.append(1))]
    assert bench.main(["--out", str(tmp_path / "GPU.md")], parts=parts) == 1
    assert cleaned == [True] and not ran and signal.getsignal(signal.SIGTERM) == before
    report = (tmp_path / "GPU.md").read_text()
    assert "interrupted (signal" in report and "not run: interrupted" in report and "| device | X |" in report


def test_the_part_names_of_the_issue(bench):
    names = [n for n, _ in bench.PARTS]
    assert names == ["discovery", "gpu_tests", "h2d_bandwidth", "classify", "embed", "mps", "colocation"]


def test_discovery_reads_nvml_and_the_units_without_changing_anything(bench, tmp_path):
    gpu = FakeGPU.h100_80gb(mig=False)
    nvml = MigNVML([gpu])
    nvml.nvmlSystemGetDriverVersion = lambda: "570.86.15"
    nvml.nvmlSystemGetCudaDriverVersion = lambda: 12080
    out = bench.discovery_part(bench.Context(tmp_path), nvml)
    assert out["driver"] == "570.86.15" and out["cuda_driver"] == "12.8"
    assert out["cuda_device"] == gpu.uuid and out["whole_gpu"] is True
    assert out["units"][0]["id"] == gpu.uuid and out["gpus"][0]["mig"] == "disabled"
    assert nvml.log == []  # nothing mutated


def _mps(tmp_path, control):
    return lambda device: MPSSession(device, root=tmp_path, runner=control, processes=NO_PIDS)


def test_the_mps_part_starts_serves_and_stops_its_own_daemon(bench, tmp_path):
    ctx = bench.Context(tmp_path, results={"discovery": {"cuda_device": "GPU-1"}})
    control = FakeRunner()
    control.servers = "4242"
    seen = {}

    def client(env):
        seen.update(env)
        return subprocess.CompletedProcess([], 0, "1073741824.0\n", "")

    out = bench.mps_part(ctx, _mps(tmp_path, control), client)
    assert out["client_ok"] and out["stopped"] and seen["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert seen["CUDA_MPS_PIPE_DIRECTORY"] == out["pipe_dir"] and not Path(out["pipe_dir"]).exists()
    assert out["server_pids"] == [4242] and control.commands()[:2] == ["-d", "get_server_list"]
    assert "quit" in control.commands() and control.up == set()


def test_the_mps_daemon_is_stopped_when_its_client_fails_or_raises(bench, tmp_path):
    ctx = bench.Context(tmp_path, results={"discovery": {"cuda_device": "GPU-1"}})
    control = FakeRunner()
    with pytest.raises(RuntimeError, match="client under MPS failed"):
        bench.mps_part(ctx, _mps(tmp_path, control), lambda env: subprocess.CompletedProcess([], 1, "", "no CUDA"))
    assert "quit" in control.commands() and control.up == set()
    control.calls.clear()

    def interrupted(env):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench.mps_part(ctx, _mps(tmp_path, control), interrupted)
    assert "quit" in control.commands() and control.up == set() and list(tmp_path.glob("mps-*")) == []


def test_colocation_is_skipped_with_mig_on(bench, tmp_path):
    ctx = bench.Context(tmp_path, results={"discovery": {"whole_gpu": False}})
    assert "MIG is on" in bench.colocation_part(ctx)["skipped"]
