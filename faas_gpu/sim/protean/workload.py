"""What arrives in a PROTEAN simulation run: the workload (a rate trace split into a strict and
changing best-effort models) and every batch drawn from it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from faas_gpu.policies.protean import Assumptions

from ..protean_trace import RateTrace, batch_arrivals
from .model import Job


@dataclass(frozen=True)
class Workload:
    """What arrives: a strict model (fixed) and best-effort models (one at a time, changing)."""

    trace: RateTrace
    strict_model: str | None
    be_models: tuple[str, ...]
    strict_share: float = 0.5
    be_switch_s: float | None = None  # None: assumptions.yaml's simulator.be_switch_s (the paper's ~20 s)


def make_jobs(workload: Workload, a: Assumptions, rng: np.random.Generator) -> list[Job]:
    """Every batch of the run, in arrival order, with its model, class, deadline and execution draw."""
    models = a.models
    cv = float(a.setting("simulator", "exec_cv"))
    sigma = math.sqrt(math.log(1 + cv * cv))
    out: list[tuple[float, str, bool]] = []
    if workload.strict_model and workload.strict_share > 0:
        b = models[workload.strict_model].batch
        out += [(t, workload.strict_model, True) for t in batch_arrivals(workload.trace, workload.strict_share, b, rng)]
    if workload.be_models and workload.strict_share < 1:
        switch_s = workload.be_switch_s or float(a.setting("simulator", "be_switch_s"))
        periods = int(workload.trace.duration_s // switch_s) + 1
        choice = [workload.be_models[int(i)] for i in rng.integers(0, len(workload.be_models), size=periods)]
        b = models[workload.be_models[0]].batch  # BE models of a workload share the domain's batch size
        for t in batch_arrivals(workload.trace, 1 - workload.strict_share, b, rng):
            out.append((t, choice[int(t // switch_s)], False))
    out.sort(key=lambda x: x[0])
    noise = rng.lognormal(-sigma * sigma / 2, sigma, size=len(out))
    jobs = []
    for i, ((t, m, strict), z) in enumerate(zip(out, noise, strict=True)):
        spec = models[m]
        deadline = t + a.slo_factor * spec.exec_7g_s if strict else None
        jobs.append(Job(i, m, strict, float(t), deadline, spec.mem_mb, spec.exec_7g_s * float(z)))
    return jobs
