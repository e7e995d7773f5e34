"""PROTEAN's RDF and FBR from co-location runs: the fit on synthetic curves, the overlay, the CLI on CPUs."""

import textwrap

import pytest
import yaml

from faas_gpu.policies.protean.slowdown import merge_assumptions
from faas_gpu.policy_data.protean import default_assumptions, parse_assumptions
from faas_gpu.profiling.colocation import Fit, Measurement, fit_fbr, fit_rdf, median_s, merge_overlays, overlay
from faas_gpu.profiling.colocation_cli import main
from faas_gpu.profiling.colocation_runner import Device

WHERE = Measurement("NVIDIA A100-SXM4-40GB (MIG-abc)", "2025-01-01", 128, 10)


def eq1(f: float, k_max: int, c: float | None = None) -> dict[int, float]:
    """T_k / T_0 under Eq. 1: k co-runners of FBR c (copies: c = f)."""
    c = f if c is None else c
    return {k: max(f + k * c, 1.0) for k in range(1, k_max + 1)}


# -- the fit ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("f", [0.2, 0.3, 0.45, 0.6, 0.8])
def test_a_bandwidth_bound_curve_gives_back_its_fbr(f):
    fit = fit_fbr(eq1(f, 6))
    assert fit.ok and fit.value == pytest.approx(f)


def test_the_fbr_beside_another_model_subtracts_the_co_runners_share():
    fit = fit_fbr(eq1(0.4, 4, c=0.3), corunner_fbr=0.3)
    assert fit.ok and fit.value == pytest.approx(0.4)


def test_a_noisy_curve_still_fits_within_its_noise():
    noise = [1.03, 0.98, 1.02, 0.97, 1.01]
    ratios = {k: r * noise[k - 1] for k, r in eq1(0.5, 5).items()}
    fit = fit_fbr(ratios)
    assert fit.ok and fit.value == pytest.approx(0.5, rel=0.05)


def test_a_compute_limited_curve_is_refused_as_such():
    fit = fit_fbr({k: k + 1.0 for k in range(1, 5)})  # the copies run one after another
    assert not fit.ok and fit.reason.startswith("compute-limited")


def test_no_slowdown_gives_only_a_bound():
    fit = fit_fbr({1: 1.01, 2: 0.99, 3: 1.02})
    assert not fit.ok and "no slowdown up to 3 co-runners" in fit.reason and "FBR < 0.25" in fit.reason


def test_a_curve_of_another_shape_does_not_fit_eq1():
    fit = fit_fbr({k: 1 + 0.3 * k for k in range(1, 6)})  # a constant cost per co-runner
    assert not fit.ok and "does not fit Eq. 1" in fit.reason


def test_faster_beside_co_runners_is_noise():
    fit = fit_fbr({1: 0.8, 2: 1.4})
    assert not fit.ok and "faster beside 1 co-runner" in fit.reason


def test_slower_than_serial_is_an_oversubscribed_device():
    fit = fit_fbr({1: 6.0, 2: 9.0})
    assert not fit.ok and "oversubscribed" in fit.reason


def test_the_fit_needs_co_runners():
    with pytest.raises(ValueError, match="k >= 1"):
        fit_fbr({0: 1.0})


def test_rdf_is_the_ratio_of_solo_times():
    assert fit_rdf(0.300, 0.120).value == pytest.approx(2.5)
    assert fit_rdf(0.118, 0.120).value == 1.0  # within noise of the whole GPU: no deficiency
    refused = fit_rdf(0.05, 0.120)
    assert not refused.ok and "faster than the whole device" in refused.reason


def test_solo_time_is_the_median():
    assert median_s([0.3, 0.1, 0.2, 5.0]) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        median_s([])


# -- the overlay -----------------------------------------------------------------------------------
def test_measured_numbers_overlay_the_package_assumptions():
    base = default_assumptions()
    rdfs = {"3g": (Fit(3.1), WHERE), "1g": (Fit(None, "noise"), WHERE)}
    text = yaml.safe_dump(overlay("resnet50", rdfs, (Fit(0.71, detail={"ratios": {1: 1.42}}), WHERE)))
    a = parse_assumptions(text)
    sd = a.slowdown
    assert sd.rdf("resnet50", "3g") == pytest.approx(3.1) != base.slowdown.rdf("resnet50", "3g")
    assert sd.rdf("resnet50", "1g") == base.slowdown.rdf("resnet50", "1g")  # refused: the width model stays
    assert sd.fbr("resnet50") == pytest.approx(0.71)
    assert sd.eta("resnet50", "3g", ["resnet50"]) == pytest.approx(3.1 * 1.42)
    assert a.models["vgg19"] == base.models["vgg19"] and a.slo_factor == base.slo_factor
    assert a.raw["models"]["resnet50"]["fbr"]["source"] == "measured"
    assert a.raw["refused"] == {"rdf.resnet50/1g": "noise"}
    assert default_assumptions().raw["models"]["resnet50"]["fbr"] == 0.55  # the package's is untouched


def test_an_overlay_cannot_add_a_model_without_its_entry():
    text = yaml.safe_dump({"base": "package", "models": {"tiny": {"fbr": 0.3}}})
    with pytest.raises(ValueError, match=r"models\.tiny: missing domain"):
        parse_assumptions(text)


def test_only_the_package_is_a_base():
    with pytest.raises(ValueError, match="base: only 'package'"):
        parse_assumptions("base: ../other.yaml\n")


def test_merge_keeps_what_it_does_not_replace():
    assert merge_assumptions({"a": {"x": 1, "y": 2}, "b": 3}, {"a": {"y": 5}, "b": 4}) == {
        "a": {"x": 1, "y": 5},
        "b": 4,
    }


def test_a_new_measurement_clears_its_old_refusal_and_keeps_other_models():
    old = overlay("bert", {"3g": (Fit(2.0), WHERE)}, (Fit(None, "noise"), WHERE))
    new = overlay("bert", {}, (Fit(0.6), WHERE))
    merged = merge_overlays(old, new)
    assert merged["rdf"]["bert/3g"]["value"] == 2.0 and merged["models"]["bert"]["fbr"]["value"] == 0.6
    assert "refused" not in merged


def test_devices_parse():
    assert Device.parse("cpu:2") == Device("cpu:2", "cpu", "", 2)
    assert Device.parse("MIG-1234").visible == "MIG-1234"
    assert Device.parse("cuda:GPU-ab").visible == "GPU-ab"
    assert Device.parse("cuda").visible is None
    for bad in ("cpu:0", "tpu", "cpu:x"):
        with pytest.raises(ValueError):
            Device.parse(bad)


# -- the CLI ---------------------------------------------------------------------------------------
MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    """
)
BASE = ["--model", "model.py:make", "--input-shape", "32", "--batch", "8", "--name", "resnet50"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "full.yaml").write_text("gpu: A100-40GB\n")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--devices", "7g"], "--devices"),
        (["--devices", "5g=cpu:1"], "--devices"),
        (["--devices", "7g=tpu:0"], "--devices"),
        (["--devices", "7g=cpu:1,7g.40gb=cpu:1"], "--devices"),
        (["--devices", "7g=cpu:1", "--colocate-on", "3g"], "--colocate-on"),
        (["--devices", "7g=cpu:1", "--gpu", "V100"], "--gpu"),
        (["--devices", "7g=cpu:1", "--batch", "0"], "--batch"),
        (["--devices", "7g=cpu:1", "--max-corunners", "-1"], "--max-corunners"),
        (["--devices", "7g=cpu:1", "--corunner", "model.py:make"], "--corunner-fbr"),
        (["--devices", "7g=cpu:1", "--corunner-fbr", "0.3"], "--corunner"),
        (["--devices", "7g=cpu:1", "--model", "model.py:nope"], "--model"),
        (["--devices", "7g=cpu:1", "--out", "full.yaml"], "--out"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(project, capsys, args, flag):
    rc = main([*BASE, *args])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith(f"faas-gpu profile-colocation: {flag}")


def test_profiles_on_cpu_threads_into_an_overlay(project, capsys):
    out = project / "measured.yaml"
    args = ["--devices", "7g=cpu:1,1g=cpu:1", "--max-corunners", "1", "--repeat", "3", "--warmup", "1"]
    assert main([*BASE, *args, "--out", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    data = yaml.safe_load(out.read_text())
    assert data["base"] == "package"
    refused = data.get("refused", {})
    rdf = data.get("rdf", {}).get("resnet50/1g")
    assert (rdf is not None and rdf["value"] > 0 and rdf["source"] == "measured") or refused["rdf.resnet50/1g"]
    fbr = data.get("models", {}).get("resnet50", {}).get("fbr")
    assert (fbr is not None and fbr["value"] > 0 and fbr["device"]) or refused["models.resnet50.fbr"]
    parse_assumptions(out.read_text())  # loads as the scheduler's --protean-assumptions would


def test_the_command_is_a_faas_gpu_subcommand(capsys):
    from faas_gpu.cli import main as faas_gpu

    with pytest.raises(SystemExit) as exc:
        faas_gpu(["profile-colocation", "--help"])
    assert exc.value.code == 0 and "--max-corunners" in capsys.readouterr().out
