"""The fitter recovers Eq. 1-2 coefficients from profiling runs and rejects fits no planner should use."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.harmony import CpuCoefficients, ExpCurve
from faas_gpu.policies.harmony.fitter import (
    CoefficientError,
    CpuSample,
    GpuFit,
    GpuSample,
    NegativeCoefficientError,
    NonMonotoneCoefficientError,
    fit_cpu,
    fit_curve,
    fit_gpu,
    validate_cpu,
    validate_gpu,
)
from faas_gpu.policy_data.harmony import load_model, load_models
from faas_gpu.profiling.harmony_runs import profile_cpu

VGG = load_model(SHARED_DATA / "harmonybatch" / "model.json", "VGG19")
VCPUS = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]


def synthetic_runs(cpu: CpuCoefficients, noise: float = 0.0, seed: int = 0) -> list[CpuSample]:
    """100 runs per configuration whose mean is the avg curve and whose maximum is the max curve."""
    rng = np.random.default_rng(seed)
    out = []
    for b, c in itertools.product(range(1, cpu.max_batch + 1), VCPUS):
        avg, mx = cpu.latency_avg(c, b), cpu.latency_max(c, b)
        avg *= 1 + noise * rng.standard_normal()
        mx = max(mx * (1 + noise * rng.standard_normal()), avg * 1.01)
        runs = [avg] * 98 + [2 * avg - mx, mx]  # mean avg, maximum mx
        out.append(CpuSample(b, c, tuple(runs)))
    return out


def test_fit_recovers_the_coefficients_it_was_made_from():
    fit = fit_cpu(synthetic_runs(VGG.cpu))
    for got, want in zip(fit.avg + fit.max, VGG.cpu.avg + VGG.cpu.max, strict=True):
        assert got.alpha == pytest.approx(want.alpha, rel=1e-6)
        assert got.beta == pytest.approx(want.beta, rel=1e-6)
        assert got.gamma == pytest.approx(want.gamma, rel=1e-6)


def test_fit_with_noise_stays_close_in_latency():
    fit = fit_cpu(synthetic_runs(VGG.cpu, noise=0.01, seed=3))
    for b in range(1, 5):
        for c in VCPUS:
            assert fit.latency_avg(c, b) == pytest.approx(VGG.cpu.latency_avg(c, b), rel=0.03)


def test_curve_fit_needs_three_vcpu_sizes():
    with pytest.raises(ValueError, match="three or more"):
        fit_curve([1.0, 2.0, 2.0], [0.3, 0.2, 0.2])


def test_gpu_fit_recovers_xi1_xi2_and_keeps_them_positive():
    runs = [GpuSample(b, (VGG.gpu.base_latency(b),) * 3) for b in (1, 8, 16)]
    fit = fit_gpu(runs)
    assert fit.xi1 == pytest.approx(VGG.gpu.xi1, rel=1e-9)
    assert fit.xi2 == pytest.approx(VGG.gpu.xi2, rel=1e-9)
    with pytest.raises(NegativeCoefficientError) as e:
        fit_gpu([GpuSample(1, (0.010,)), GpuSample(8, (0.005,))])
    assert e.value.coefficient == "xi1"
    with pytest.raises(NegativeCoefficientError, match="xi2"):
        validate_gpu(GpuFit(0.001, -0.0005))
    with pytest.raises(NonMonotoneCoefficientError, match="xi1"):
        fit_gpu([GpuSample(1, (0.010,)), GpuSample(8, (0.010,))])


def with_curve(cpu: CpuCoefficients, which: str, batch: int, curve: ExpCurve) -> CpuCoefficients:
    curves = list(getattr(cpu, which))
    curves[batch - 1] = curve
    return replace(cpu, **{which: tuple(curves)})


@pytest.mark.parametrize(
    "which,batch,field,value,name",
    [
        ("avg", 2, "alpha", -1.0, "alpha_avg[b=2]"),
        ("max", 3, "gamma", -0.01, "gamma_max[b=3]"),
        ("avg", 1, "beta", 0.0, "beta_avg[b=1]"),
    ],
)
def test_negative_coefficients_are_rejected_by_name(which, batch, field, value, name):
    bad = with_curve(VGG.cpu, which, batch, replace(getattr(VGG.cpu, which)[batch - 1], **{field: value}))
    with pytest.raises(NegativeCoefficientError) as e:
        validate_cpu(bad, VCPUS)
    assert e.value.coefficient == name
    assert name in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_bigger_batch_that_runs_faster_is_rejected_by_name():
    # gamma of batch 3 below batch 2's: batch 3 would be faster with many vCPU
    b3 = VGG.cpu.avg[2]
    bad = with_curve(VGG.cpu, "avg", 3, replace(b3, gamma=VGG.cpu.avg[1].gamma * 0.5))
    with pytest.raises(NonMonotoneCoefficientError) as e:
        validate_cpu(bad, VCPUS)
    assert e.value.coefficient == "gamma_avg[b=3]"
    assert "bigger batch would run faster" in str(e.value)


def test_runs_that_fall_with_the_batch_size_are_rejected_from_the_fit():
    cpu = VGG.cpu
    swapped = replace(cpu, avg=(cpu.avg[0], cpu.avg[2], cpu.avg[1], cpu.avg[3]))  # batch 3 faster than 2
    swapped = replace(swapped, max=(cpu.max[0], cpu.max[2], cpu.max[1], cpu.max[3]))
    with pytest.raises(NonMonotoneCoefficientError) as e:
        fit_cpu(synthetic_runs(swapped))
    assert e.value.coefficient in {"gamma_avg[b=3]", "alpha_avg[b=3]"}
    assert "batch 3" in str(e.value) or "b=3" in str(e.value)


def test_a_maximum_below_the_average_is_rejected():
    bad = replace(VGG.cpu, max=(VGG.cpu.avg[0].__class__(0.5, 0.5, 0.1),) + VGG.cpu.max[1:])
    with pytest.raises(CoefficientError, match=r"alpha_max\[b=1\].*below the average"):
        validate_cpu(bad, VCPUS)


def test_published_coefficients_pass_validation_except_videomaes_maximum():
    models = load_models(SHARED_DATA / "harmonybatch" / "model.json")
    for name in ("VGG19", "Bert", "GPT-2"):
        validate_cpu(models[name].cpu, VCPUS)
    # VideoMAE's published maximum for batch 2 lies below its average up to ~2.5 vCPU
    with pytest.raises(NonMonotoneCoefficientError, match=r"alpha_max\[b=2\].*below the average"):
        validate_cpu(models["VideoMAE"].cpu, [1.0, 2.0, 4.0])
    validate_cpu(models["VideoMAE"].cpu, [3.0, 4.0, 8.0, 16.0])


def test_profile_cpu_runs_a_torch_model_per_thread_count_and_batch():
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ticks = itertools.count()
    before = torch.get_num_threads()
    seen = []

    def clock():  # a fake clock: each reading is one tick later, and notes the thread count in use
        seen.append(torch.get_num_threads())
        return next(ticks) * 0.001

    runs = profile_cpu(net, lambda b: torch.randn(b, 8), threads=(1, 2), clock=clock, repeats=3)
    assert [(s.vcpu, s.batch) for s in runs] == [(t, b) for t in (1.0, 2.0) for b in (1, 2, 3, 4)]
    assert all(s.latencies == pytest.approx((0.001,) * 3) for s in runs)
    assert set(seen) == {1, 2}
    assert torch.get_num_threads() == before


def test_profile_cpu_with_the_real_clock_feeds_the_fitter():
    torch = pytest.importorskip("torch")
    import time

    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    runs = profile_cpu(net, lambda b: torch.randn(b, 64), threads=(1, 2, 3), clock=time.perf_counter, repeats=2)
    assert len(runs) == 12 and all(min(s.latencies) > 0 for s in runs)
    try:  # a fit of a 2-core machine's runs may or may not be usable; either way the answer is explicit
        fit = fit_cpu(runs)
    except CoefficientError as e:
        assert e.coefficient and e.reason
    else:
        assert all(math.isfinite(c.alpha) for c in fit.avg)
