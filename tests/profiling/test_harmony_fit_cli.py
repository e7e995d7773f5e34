"""`faas-gpu fit`: the coefficients file it writes is one the provider's HarmonyBatch pools read.

Timing a model on this 2-core machine at 3+ thread counts oversubscribes it (the fitter then
rightly refuses the curves), so the success path replays runs that follow Eq. 1 exactly.
"""

import json
import math

import pytest

from faas_gpu import cli
from faas_gpu.policies.harmony import App, plan
from faas_gpu.policies.harmony.cost import ALIBABA_FC_CNY
from faas_gpu.policies.harmony.fitter import CpuSample
from faas_gpu.policy_data.harmony import load_models
from tests.harmony_models import VGG19

MODEL = """
from torch import nn


def make():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    (tmp_path / "tiny.py").write_text(MODEL)
    (tmp_path / "vgg.json").write_text(json.dumps({"VGG19": VGG19}))
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    return tmp_path


def fake_runs(model, make_batch, threads, clock, batches=(1, 2, 3, 4), repeats=5, warmup=1):
    """Runs whose average is 0.3*b*exp(-c/2) + 0.05*b and whose maximum is 20% above it."""
    out = []
    for c in threads:
        for b in batches:
            mean = 0.3 * b * math.exp(-c / 2) + 0.05 * b
            out.append(CpuSample(b, float(c), (mean * 0.9, mean * 0.9, mean * 1.2)))
    return out


def test_fitted_coefficients_are_written_in_model_json_format(files, monkeypatch, capsys):
    monkeypatch.setattr("faas_gpu.profiling.harmony_runs.profile_cpu", fake_runs)
    rc = cli.main(
        [
            "fit",
            "--model",
            f"{files}/tiny.py:make",
            "--input-shape",
            "8",
            "--name",
            "tiny",
            "--threads",
            "1,2,4,8",
            "--gpu-from",
            f"{files}/vgg.json:VGG19",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    models = load_models(files / "home" / "harmony-models.json")
    tiny = models["tiny"]
    assert tiny.cpu_latency_avg(2.0, 1) == pytest.approx(0.3 * math.exp(-1) + 0.05, rel=1e-3)
    p = plan([App("a", 1.0, 5.0), App("b", 2.0, 10.0)], tiny, ALIBABA_FC_CNY)
    assert p.groups


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "1,2"], "--threads: Eq. 1 needs at least 3"),
        ([], "--gpu-from: the planner needs GPU coefficients"),
        (["--gpu-from", "nofile"], "--gpu-from: expected FILE:MODEL"),
        (["--input-shape", "x"], "--input-shape"),
    ],
)
def test_bad_input_names_the_flag(files, capsys, args, message):
    base = {"--model": f"{files}/tiny.py:make", "--input-shape": "8", "--name": "tiny", "--threads": "1,2,4"}
    if "--gpu-from" not in args and message.startswith("--threads"):
        args = [*args, "--gpu-from", f"{files}/vgg.json:VGG19"]
    given = dict(zip(args[::2], args[1::2], strict=True))
    argv = ["fit"] + [x for k, v in {**base, **given}.items() for x in (k, v)]
    if message.startswith("--input-shape"):
        argv += ["--gpu-from", f"{files}/vgg.json:VGG19"]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
