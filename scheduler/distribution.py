"""PROTEAN's Job Distribution (Alg. 1), live: this round's view of the MIG slices for LALB.

With a `distributor` (`--distribution protean`) the scheduler chooses the MIG slice: before each
round the leader loop hands LALB a `JobDistributionPreference` over the slices of the GPUs the
assumptions know (`scheduler.gpus`) and the best-effort memory resident on each
(`scheduler.residency.resident_counts`, as the Reconfigurator counts it); LALB asks it whenever
it chooses among idle units (`faas_gpu.policies.lalb_job_distribution` says what wins over what).
Built from the unit view and the jobs, under the scheduler's lock; the decision is the policy's.

A slice's memory is the one its GPU Manager reports (NVML's usable memory: 4864 MiB for an
A100's 1g.5gb), not the assumptions file's nominal size (5120 MiB): a job the policy thinks fits
must fit the unit's own cache, or the manager answers 507. The nominal size is used only for a
unit that reports none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from faas_gpu.policies.lalb_job_distribution import JobClass, JobDistributionPreference, MigSlice, be_footprint
from faas_gpu.policies.protean.distribution import JobDistributor, SliceState
from faas_gpu.policies.protean.mig import InvalidGeometry

from .jobs import Job
from .residency import resident_counts
from .units import UnitView


def job_distribution(
    distributor: JobDistributor | None,
    view: UnitView,
    jobs: Mapping[int, Job],
    resident_jobs: Callable[[], list[tuple[str | None, bool, str | None]]],
) -> JobDistributionPreference | None:
    """Alg. 1's view of this round: the MIG slices of the distributor's GPUs, what runs on them,
    and the best-effort memory resident on each GPU; None when not needed (no distributor, no
    MIG unit of its GPU, no idle unit or no queued job)."""
    policy = view.policy
    if distributor is None or not view.unit_gpu or not policy.idle or not policy.queue:
        return None
    sd = distributor.slowdown
    held = view.unavailable()
    slices = []
    for i, u in enumerate(view.units):
        gpu = view.unit_gpu.get(u.key)
        if gpu is None or not u.profile:
            continue
        try:
            profile = sd.gpu.profile(u.profile).key
        except InvalidGeometry:
            continue
        running = policy.units[i].running
        job = jobs.get(running.id) if running is not None else None
        known = job is not None and job.model in sd.models
        mem = sd.spec(job.model).mem_mb if known else 0.0
        state = SliceState(
            i,
            profile,
            float(u.memory_mb) if u.memory_mb > 0 else float(sd.gpu.memory_mb(profile)),
            used_mb=mem,
            running=((job.model, not job.best_effort),) if known else (),
            available=u.key not in held,
            strict_mb=mem if known and not job.best_effort else 0.0,
        )
        slices.append(MigSlice(gpu, state))
    if not slices:
        return None
    open_gpus = {view.unit_gpu[view.units[s.state.id].key] for s in slices if s.state.available}
    counts = resident_counts(resident_jobs(), view.unit_gpu, open_gpus)
    be_mem, be_model = be_footprint(counts, sd)
    queued = {j.id: JobClass(j.model, not j.best_effort) for j in jobs.values() if j.queued and j.model}
    return JobDistributionPreference(distributor, slices, queued, be_mem, be_model)
