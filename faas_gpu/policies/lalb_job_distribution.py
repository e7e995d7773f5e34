"""PROTEAN's Job Distribution (§4.3, Algorithm 1) as LALB's unit preference over MIG slices.

The scheduler daemon places jobs with LALB-O3 (`lalb.py`); on MIG GPUs whose model the
assumptions file knows, which slice a job runs on matters as much as where its model is cached
(PROTEAN's Guidelines 1 and 2). `JobDistributionPreference` is the `unit_preference` LALB asks
when it chooses among idle units; the decisions are the simulator's `JobDistributor`:

1. Tags (Alg. 1, lines 1-8): each GPU's slices, smallest first, with the share of their memory
   the best-effort (BE) work resident on that GPU will take (`tag_slices`). The footprint is
   the memory of the BE jobs running or queued there, the queued ones shared among the GPUs
   as the Reconfigurator's controller counts them (`be_footprint`).
2. A strict job: per GPU, `choose_strict_slice` over its idle slices (the least eta, Eq. 2,
   among those not fully tagged, the batches running on each as co-located); across GPUs the
   least eta wins, a slice not fully tagged before one that is.
3. A best-effort job: per GPU, `choose_best_effort_slice` over its idle slices (first fit in
   ascending size); across GPUs the smallest of those.

Precedence: PROTEAN's choice first, cache locality second. The preference names the slices
PROTEAN cannot tell apart from its choice (the same eta, or the same size for BE work, on
other GPUs), and LALB picks a unit caching the model among them. Idle units that are not MIG
slices of a known GPU stay open as well: PROTEAN has no opinion on them, LALB does.
No opinion at all (None, LALB's choice unchanged): a job whose model has no slowdown spec,
no idle MIG slice of a known GPU, or no such slice that the job fits (by the assumed memory).

Slice memory is the profile table's (`mig_profiles.yaml`), as in the simulator and the
Reconfigurator, so the three see the same slices. A GPU Manager runs one job at a time per
unit, so an idle slice has nothing running on it; busy slices still count in the tags.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .lalb import Request, Unit
from .protean.distribution import Batch, JobDistributor, SliceState, tag_slices
from .protean.slowdown import SlowdownModel

EPS = 1e-9


@dataclass(frozen=True)
class MigSlice:
    """A LALB unit that is a MIG slice of a GPU the assumptions know (`state.id` is the unit's id)."""

    gpu: Hashable
    state: SliceState


@dataclass(frozen=True)
class JobClass:
    """What PROTEAN needs of a job: its model's name and whether it is strict."""

    model: str | None
    strict: bool
    slack_s: float | None = None  # strict: time left to its deadline now (the simulator's deadline-aware Alg. 1)


def be_footprint(
    counts: Mapping[tuple[Hashable, bool, str | None], float], slowdown: SlowdownModel
) -> tuple[dict[Hashable, float], dict[Hashable, str]]:
    """Counts per (GPU, best-effort, model) → (BE memory per GPU, the BE model most resident per GPU).

    Only models with a slowdown spec have a memory; ties between models go to the first name.
    """
    mem: dict[Hashable, float] = defaultdict(float)
    by_model: dict[Hashable, dict[str, float]] = defaultdict(dict)
    for (gpu, best_effort, model), n in counts.items():
        if best_effort and model in slowdown.models and n > 0:
            mem[gpu] += n * slowdown.spec(model).mem_mb
            by_model[gpu][model] = by_model[gpu].get(model, 0.0) + n
    top = {g: max(sorted(m), key=lambda k: m[k]) for g, m in by_model.items()}
    return dict(mem), top


class JobDistributionPreference:
    """LALB's `unit_preference` from Alg. 1 over one snapshot of the MIG slices and jobs.

    `slices`: every MIG slice of a known GPU (busy ones too: they count in the tags).
    `jobs`: request id → its class. `be_mem_mb` / `be_model`: per GPU (`be_footprint`).
    The snapshot holds while the slices' jobs do not change, i.e. for one scheduling round.
    """

    def __init__(
        self,
        distributor: JobDistributor,
        slices: Iterable[MigSlice],
        jobs: Mapping[int, JobClass],
        be_mem_mb: Mapping[Hashable, float],
        be_model: Mapping[Hashable, str] | None = None,
        *,
        strict_expected: bool = True,
    ):
        """`strict_expected`: False when no strict work is predicted on these GPUs (the simulator's
        extended PROTEAN, `JobDistributor.choose_without_strict_work`); the daemon keeps True."""
        self.distributor = distributor
        self.strict_expected = strict_expected
        self.slowdown = distributor.slowdown
        self.slices = {s.state.id: s for s in slices}
        self.jobs = jobs
        self.be_model = dict(be_model or {})
        per_gpu: dict[Hashable, list[SliceState]] = defaultdict(list)
        for s in self.slices.values():
            per_gpu[s.gpu].append(s.state)
        self.tags: dict[Hashable, float] = {}
        for gpu, states in per_gpu.items():
            self.tags.update(tag_slices(states, be_mem_mb.get(gpu, 0.0), self.slowdown))

    def batch(self, request: Request) -> Batch | None:
        """The job as a batch of Alg. 1, or None when its model has no slowdown spec."""
        job = self.jobs.get(request.id)
        if job is None or job.model not in self.slowdown.models:
            return None
        return Batch(request.id, job.model, job.strict, self.slowdown.spec(job.model).mem_mb, job.slack_s)

    def choose(self, batch: Batch, idle: Sequence[SliceState]) -> list[SliceState]:
        """PROTEAN's slice for `batch` among the idle slices, with those it cannot tell apart from it.

        Per GPU the choice is the distributor's (`JobDistributor.place`: Alg. 1, with whatever
        extensions it was built with); across GPUs the least eta wins for a strict batch, a slice
        not fully tagged before one that is, and the smallest slice for a best-effort one."""
        per_gpu: dict[Hashable, list[SliceState]] = defaultdict(list)
        for s in idle:
            per_gpu[self.slices[s.id].gpu].append(s)
        place, tags = self.distributor.place, self.tags
        picks = [
            (gpu, chosen)
            for gpu, states in per_gpu.items()
            if (chosen := place(batch, states, tags, self.be_model.get(gpu), self.strict_expected)) is not None
        ]
        if not picks:
            return []
        if batch.strict and all(eta is not None for _, (_, eta) in picks):
            keyed = [((self.tags.get(s.id, 0.0) >= 1.0, eta), s) for _, (s, eta) in picks]
            full, least = min(k for k, _ in keyed)
            return [s for (f, e), s in keyed if f == full and e <= least + EPS]
        gpu_model = self.slowdown.gpu
        sized = [((gpu_model.profile(s.profile).slices, s.memory_mb), s) for _, (s, _) in picks]
        smallest = min(k for k, _ in sized)
        return [s for k, s in sized if k == smallest]

    def __call__(self, request: Request, idle: Sequence[Unit]) -> Collection[int] | None:
        batch = self.batch(request)
        if batch is None:
            return None
        mig = [self.slices[u.id].state for u in idle if u.id in self.slices]
        if not mig:
            return None
        chosen = self.choose(batch, mig)
        if not chosen:
            return None
        return [s.id for s in chosen] + [u.id for u in idle if u.id not in self.slices]
