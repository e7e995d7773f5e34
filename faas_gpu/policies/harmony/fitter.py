"""Eq. 1-2 coefficients from profiling runs (§III-A, "Model coefficients acquisition").

CPU: for each batch size (1..4) the model runs many times at several vCPU sizes; the mean and the
maximum of each configuration's latencies are fitted to alpha * exp(-c / beta) + gamma by least
squares (for a fixed beta the model is linear in alpha and gamma, so beta is searched on a log
grid, then refined by golden section, and alpha, gamma solved exactly for each beta).
GPU: latency on the whole GPU against batch size, a straight line xi1 * b + xi2.

Fits are checked before anyone plans with them: a negative coefficient, or latencies that fall
as the batch grows or that put the maximum below the average, raise a `CoefficientError` (a
ValueError) naming the coefficient and the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .models import CpuCoefficients, ExpCurve


@dataclass(frozen=True)
class CpuSample:
    """Latencies (s) of repeated runs of one batch size at one vCPU size."""

    batch: int
    vcpu: float
    latencies: tuple[float, ...]


@dataclass(frozen=True)
class GpuSample:
    """Latencies (s) of repeated runs of one batch size on the whole GPU."""

    batch: int
    latencies: tuple[float, ...]


@dataclass(frozen=True)
class GpuFit:
    xi1: float
    xi2: float


class CoefficientError(ValueError):
    """A fitted coefficient no planner should use; `coefficient` names it, e.g. 'gamma_avg[b=2]'."""

    def __init__(self, coefficient: str, value: float, reason: str) -> None:
        self.coefficient = coefficient
        self.value = value
        self.reason = reason
        super().__init__(f"{coefficient} = {value:.6g}: {reason}")


class NegativeCoefficientError(CoefficientError):
    pass


class NonMonotoneCoefficientError(CoefficientError):
    pass


def _solve_linear(x: np.ndarray, y: np.ndarray, beta: float) -> tuple[float, float, float]:
    e = np.exp(-x / beta)
    a = np.column_stack([e, np.ones_like(e)])
    (alpha, gamma), *_ = np.linalg.lstsq(a, y, rcond=None)
    sse = float(np.sum((a @ np.array([alpha, gamma]) - y) ** 2))
    return float(alpha), float(gamma), sse


def fit_curve(vcpus: Sequence[float], latencies: Sequence[float]) -> ExpCurve:
    """Least-squares fit of Eq. 1 to (vCPU, latency) points; needs three distinct vCPU sizes."""
    x = np.asarray(vcpus, dtype=float)
    y = np.asarray(latencies, dtype=float)
    if x.shape != y.shape or len(set(x.tolist())) < 3:
        raise ValueError("fit_curve: need latencies at three or more distinct vCPU sizes")
    span = float(x.max())
    grid = np.geomspace(span * 1e-3, span * 1e3, 121)
    sse = [_solve_linear(x, y, b)[2] for b in grid]
    k = int(np.argmin(sse))
    lo, hi = math.log(grid[max(k - 1, 0)]), math.log(grid[min(k + 1, len(grid) - 1)])
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(80):  # golden section on log(beta)
        m1, m2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if _solve_linear(x, y, math.exp(m1))[2] <= _solve_linear(x, y, math.exp(m2))[2]:
            hi = m2
        else:
            lo = m1
        if hi - lo < 1e-10:
            break
    beta = math.exp((lo + hi) / 2)
    alpha, gamma, _ = _solve_linear(x, y, beta)
    return ExpCurve(alpha, beta, gamma)


def fit_cpu(samples: Sequence[CpuSample], mem_mb_per_batch: float = 0.0, mem_mb_fixed: float = 0.0) -> CpuCoefficients:
    """Eq. 1 coefficients (average and maximum) for batch sizes 1..B from profiling runs, validated."""
    by_batch: dict[int, list[CpuSample]] = {}
    for s in samples:
        if not s.latencies:
            raise ValueError(f"fit_cpu: no latencies for batch {s.batch} at {s.vcpu} vCPU")
        by_batch.setdefault(s.batch, []).append(s)
    batches = sorted(by_batch)
    if not batches or batches != list(range(1, batches[-1] + 1)):
        raise ValueError(f"fit_cpu: need every batch size from 1 up, got {batches}")
    avg, mx = [], []
    for b in batches:
        rows = sorted(by_batch[b], key=lambda s: s.vcpu)
        c = [s.vcpu for s in rows]
        avg.append(fit_curve(c, [float(np.mean(s.latencies)) for s in rows]))
        mx.append(fit_curve(c, [max(s.latencies) for s in rows]))
    coeffs = CpuCoefficients(tuple(avg), tuple(mx), mem_mb_per_batch, mem_mb_fixed)
    validate_cpu(coeffs, sorted({s.vcpu for s in samples}))
    return coeffs


def validate_cpu(coeffs: CpuCoefficients, vcpus: Sequence[float]) -> None:
    """Raise CoefficientError unless every curve is non-negative, falls with vCPU, grows with the
    batch size (at each profiled vCPU size) and keeps the maximum at or above the average."""
    tol = 1e-9
    for which, curves in (("avg", coeffs.avg), ("max", coeffs.max)):
        for i, cv in enumerate(curves):
            b = i + 1
            if cv.alpha < 0:
                raise NegativeCoefficientError(
                    f"alpha_{which}[b={b}]", cv.alpha, "negative: latency would grow with more vCPU"
                )
            if cv.beta <= 0:
                raise NegativeCoefficientError(f"beta_{which}[b={b}]", cv.beta, "must be > 0 (a vCPU scale)")
            if cv.gamma < 0:
                raise NegativeCoefficientError(
                    f"gamma_{which}[b={b}]", cv.gamma, "negative: latency would fall below zero with many vCPU"
                )
            if i == 0:
                continue
            prev = curves[i - 1]
            if cv.gamma < prev.gamma - tol:
                raise NonMonotoneCoefficientError(
                    f"gamma_{which}[b={b}]",
                    cv.gamma,
                    f"below gamma_{which}[b={b - 1}] = {prev.gamma:.6g}: a bigger batch would run faster",
                )
            for c in vcpus:
                if cv(c) < prev(c) - tol:
                    raise NonMonotoneCoefficientError(
                        f"alpha_{which}[b={b}]",
                        cv.alpha,
                        f"latency at batch {b} ({cv(c):.6g} s) is below batch {b - 1} ({prev(c):.6g} s) at {c:g} vCPU",
                    )
    for i, (a, m) in enumerate(zip(coeffs.avg, coeffs.max, strict=True)):
        for c in vcpus:
            if m(c) < a(c) - tol:
                raise NonMonotoneCoefficientError(
                    f"alpha_max[b={i + 1}]",
                    m.alpha,
                    f"maximum latency ({m(c):.6g} s) is below the average ({a(c):.6g} s) at {c:g} vCPU",
                )


def fit_gpu(samples: Sequence[GpuSample]) -> GpuFit:
    """Eq. 2 by least squares on the mean latency of each batch size (whole GPU), validated."""
    xs = [s.batch for s in samples if s.latencies]
    if len(set(xs)) < 2:
        raise ValueError("fit_gpu: need runs at two or more batch sizes")
    x = np.asarray(xs, dtype=float)
    y = np.asarray([float(np.mean(s.latencies)) for s in samples if s.latencies])
    (xi1, xi2), *_ = np.linalg.lstsq(np.column_stack([x, np.ones_like(x)]), y, rcond=None)
    fit = GpuFit(float(xi1), float(xi2))
    validate_gpu(fit)
    return fit


def validate_gpu(fit: GpuFit, tol: float = 1e-12) -> None:
    """Raise CoefficientError unless the GPU latency grows with the batch (xi1 > 0) from xi2 >= 0."""
    if fit.xi1 < -tol:
        raise NegativeCoefficientError("xi1", fit.xi1, "negative: GPU latency would fall as the batch grows")
    if fit.xi1 <= tol:
        raise NonMonotoneCoefficientError("xi1", fit.xi1, "zero: GPU latency would not grow with the batch size")
    if fit.xi2 < -tol:
        raise NegativeCoefficientError("xi2", fit.xi2, "negative: a batch's fixed GPU latency cannot be below zero")
