"""Job Distribution: which slice of a GPU each batch runs on (PROTEAN §4.3, Algorithm 1).

1. Tag the slices, smallest first, with the share of their memory that best-effort (BE) work
   will take: tag = min(1, BE_mem / available_mem), BE_mem decreasing as slices fill
   (lines 1-8). BE_mem is the memory of the BE batches queued or running on the GPU.
2. Every batch of the reordered queue (strict first, `classes.ClassQueue`) then gets a slice:
   - strict (`choose_strict_slice`, ⑦): among the slices not fully tagged (tag < 1), the one
     with the least slowdown eta (Eq. 2), counting the FBRs of the batches running there and of
     the BE work its tag says is coming. This trades the resource deficiency of a small slice
     against the interference on a crowded large one (Guideline 2).
   - best-effort (`choose_best_effort_slice`, ⑧): first fit over the slices in ascending size,
     so BE work is packed into the fewest, smallest slices (Guideline 1).
A batch that fits no slice's free memory now stays queued.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .slowdown import Assumptions, SlowdownModel


@dataclass(frozen=True)
class SliceState:
    """A slice (or the whole GPU) as the distributor sees it now."""

    id: Hashable
    profile: str  # "4g"
    memory_mb: float
    used_mb: float = 0.0
    running: tuple[tuple[str, bool], ...] = ()  # (model, strict) of each batch running on it
    available: bool = True  # False while the GPU drains for a reconfiguration
    strict_mb: float = 0.0  # part of used_mb held by strict batches
    reserved_mb: float = 0.0  # memory kept for strict batches (BE may not take it)

    @property
    def free_mb(self) -> float:
        return self.memory_mb - self.used_mb

    @property
    def be_available_mb(self) -> float:
        """Memory BE work may hold here: all of it less what strict batches hold or have reserved."""
        return max(0.0, self.memory_mb - max(self.strict_mb, self.reserved_mb))

    @property
    def be_free_mb(self) -> float:
        return min(self.free_mb, self.be_available_mb - (self.used_mb - self.strict_mb))

    def with_batch(self, model: str, strict: bool, mem_mb: float) -> SliceState:
        return replace(
            self,
            used_mb=self.used_mb + mem_mb,
            strict_mb=self.strict_mb + (mem_mb if strict else 0.0),
            running=(*self.running, (model, strict)),
        )


@dataclass(frozen=True)
class Batch:
    id: Hashable
    model: str
    strict: bool
    mem_mb: float
    slack_s: float | None = None  # strict: time left to its deadline (used when deadline_aware)


@dataclass(frozen=True)
class Placement:
    batch: Batch
    slice: Hashable
    eta: float | None = None  # the slowdown the distributor expected (strict batches)


@dataclass
class Distribution:
    placements: list[Placement] = field(default_factory=list)
    waiting: list[Batch] = field(default_factory=list)  # fit nowhere now
    tags: dict[Hashable, float] = field(default_factory=dict)


def ascending(slices: Sequence[SliceState], slowdown: SlowdownModel) -> list[SliceState]:
    """Smallest slice first (compute slices, then memory, then id)."""
    gpu = slowdown.gpu
    return sorted(slices, key=lambda s: (gpu.profile(s.profile).slices, s.memory_mb, str(s.id)))


def reserve_for_strict(slices: Sequence[SliceState], strict_mem_mb: float, slowdown: SlowdownModel) -> list[SliceState]:
    """Keep `strict_mem_mb` free of BE work on the largest slices (our extension of Guideline 1).

    Alg. 1 tags slices smallest first with the BE memory footprint; under a BE backlog that
    footprint covers every slice and strict batches find no room. Reserving the strict
    footprint (predicted by the caller) on the largest slices keeps them for strict work.
    """
    left = max(0.0, strict_mem_mb)
    out = {s.id: s for s in slices}
    for s in ascending([s for s in slices if s.available], slowdown)[::-1]:
        if left <= 0:
            break
        take = min(left, s.memory_mb)
        out[s.id] = replace(s, reserved_mb=take)
        left -= take
    return [out[s.id] for s in slices]


def tag_slices(slices: Sequence[SliceState], be_mem_mb: float, slowdown: SlowdownModel) -> dict[Hashable, float]:
    """Algorithm 1, lines 1-8: the BE tag of each slice (0 where BE work is not expected).

    A slice's available memory is its memory less what strict batches hold on it now (or have
    reserved, see `reserve_for_strict`).
    """
    tags = {s.id: 0.0 for s in slices}
    remaining = max(0.0, be_mem_mb)
    for s in ascending([s for s in slices if s.available], slowdown):
        if remaining <= 0:
            break
        avail = s.be_available_mb
        if avail <= 0:
            continue
        tags[s.id] = min(1.0, remaining / avail)
        remaining = max(0.0, remaining - avail)
    return tags


class JobDistributor:
    """Algorithm 1 over one GPU's slices, with Eq. 2 from `slowdown`.

    `be_spill`: a BE batch that fits none of the tagged slices may take a larger one (the
    paper's Fig. 7 shows such spill onto the 4g until the Reconfigurator reacts); False keeps it
    queued instead. `sm_share`: rank slices by eta with the SM-share term
    (`slowdown.eta_with_sm_share`, our extension) instead of the paper's Eq. 2.
    `deadline_aware`: a strict batch whose least-eta slice would miss its deadline waits for a
    better one while one can still come (our extension; see `worth_waiting`).
    `protect_strict_eta`: a BE batch does not join a slice where it would push a running strict
    batch's eta (SM share counted) past this bound (our extension; see `harms_strict`).
    """

    def __init__(
        self,
        slowdown: SlowdownModel,
        be_spill: bool = True,
        sm_share: bool = False,
        deadline_aware: bool = False,
        protect_strict_eta: float | None = None,
    ):
        self.slowdown = slowdown
        self.be_spill = be_spill
        self.sm_share = sm_share
        self.deadline_aware = deadline_aware
        self.protect_strict_eta = protect_strict_eta

    def harms_strict(self, batch: Batch, s: SliceState) -> bool:
        """Would this BE batch push a strict batch running on `s` past `protect_strict_eta`? (our extension)"""
        if self.protect_strict_eta is None:
            return False
        models = [m for m, _ in s.running]
        for i, (m, strict) in enumerate(s.running):
            if strict:
                others = [*models[:i], *models[i + 1 :], batch.model]
                if self.slowdown.eta(m, s.profile, others, sm_share=True) > self.protect_strict_eta:
                    return True
        return False

    def worth_waiting(self, batch: Batch, eta: float, slices: Sequence[SliceState]) -> bool:
        """Deadline-aware admission (our extension): hold a strict batch whose best slice would miss its
        deadline when a batch running here will free a slice where it could still make it."""
        if not self.deadline_aware or batch.slack_s is None:
            return False
        solo = self.slowdown.spec(batch.model).exec_7g_s
        if eta * solo <= batch.slack_s:
            return False
        best_alone = min(self.slowdown.rdf(batch.model, s.profile) for s in slices if s.available)
        return best_alone * solo <= batch.slack_s and any(s.running for s in slices)

    def expected_be(self, s: SliceState, tag: float, be_model: str | None) -> float:
        """BE batches the tag says will be on the slice, beyond those already running there."""
        if not be_model or tag <= 0:
            return 0.0
        expected = tag * s.be_available_mb / self.slowdown.spec(be_model).mem_mb
        return max(0.0, expected - sum(1 for _, strict in s.running if not strict))

    def strict_eta(self, batch: Batch, s: SliceState, tag: float, be_model: str | None) -> float:
        n_be = self.expected_be(s, tag, be_model)
        fbr = n_be * self.slowdown.fbr(be_model) if n_be else 0.0
        demand = n_be * self.slowdown.compute_demand(be_model, s.profile) if n_be else 0.0
        return self.slowdown.eta(
            batch.model, s.profile, [m for m, _ in s.running], fbr, sm_share=self.sm_share, extra_demand=demand
        )

    def choose_strict_slice(
        self, batch: Batch, slices: Sequence[SliceState], tags: Mapping[Hashable, float], be_model: str | None = None
    ) -> tuple[SliceState, float] | None:
        """⑦: the least-eta slice among those not fully tagged (any slice if every one is), that fits the batch."""
        fits = [s for s in slices if s.available and s.free_mb >= batch.mem_mb]
        open_ = [s for s in fits if tags.get(s.id, 0.0) < 1.0] or fits
        best: tuple[SliceState, float] | None = None
        for s in ascending(open_, self.slowdown)[::-1]:  # largest first: ties go to the larger slice
            e = self.strict_eta(batch, s, tags.get(s.id, 0.0), be_model)
            if best is None or e < best[1] - 1e-12:
                best = (s, e)
        return best

    def choose_best_effort_slice(
        self, batch: Batch, slices: Sequence[SliceState], tags: Mapping[Hashable, float]
    ) -> SliceState | None:
        """⑧: first fit over the slices in ascending size (tagged ones only, unless `be_spill`)."""
        for s in ascending(slices, self.slowdown):
            if not s.available or s.be_free_mb < batch.mem_mb or self.harms_strict(batch, s):
                continue
            if tags.get(s.id, 0.0) > 0 or self.be_spill:
                return s
        return None

    def choose_without_strict_work(self, batch: Batch, slices: Sequence[SliceState]) -> SliceState | None:
        """No strict work expected on the GPU (our extension): Guideline 1 keeps the large slices free
        for strict batches; with none to keep them for, a best-effort batch takes the least-eta slice."""
        chosen = self.choose_strict_slice(batch, slices, {}, None)
        return chosen[0] if chosen else None

    def place(
        self,
        batch: Batch,
        slices: Sequence[SliceState],
        tags: Mapping[Hashable, float],
        be_model: str | None = None,
        strict_expected: bool = True,
    ) -> tuple[SliceState, float | None] | None:
        """Alg. 1 for one batch over one GPU's slices now: (its slice, the eta for a strict batch),
        or None when it waits. The one coding of the per-batch choice: `distribute` and LALB's
        `JobDistributionPreference` (the live scheduler's and the simulator's) both ask it."""
        if batch.strict:
            chosen = self.choose_strict_slice(batch, slices, tags, be_model)
            if chosen is None or self.worth_waiting(batch, chosen[1], slices):
                return None
            return chosen
        no_strict = not strict_expected and not any(st for x in slices for _, st in x.running)
        if no_strict:
            s = self.choose_without_strict_work(batch, slices)
        else:
            s = self.choose_best_effort_slice(batch, slices, tags)
        return None if s is None else (s, None)

    def distribute(
        self,
        batches: Sequence[Batch],
        slices: Sequence[SliceState],
        be_mem_mb: float | None = None,
        be_model: str | None = None,
        strict_reserve_mb: float = 0.0,
        strict_expected: bool = True,
    ) -> Distribution:
        """Place `batches` (already in serving order) on `slices`; `be_mem_mb` defaults to the BE footprint.

        `strict_reserve_mb`: memory kept free of BE work on the largest slices (`reserve_for_strict`).
        `strict_expected`: False when the caller predicts no strict work on this GPU
        (`choose_without_strict_work`).
        """
        if strict_reserve_mb > 0:
            slices = reserve_for_strict(slices, strict_reserve_mb, self.slowdown)
        state = {s.id: s for s in slices}
        if be_mem_mb is None:  # BE footprint on the GPU: queued BE batches and those running
            be_mem_mb = sum(b.mem_mb for b in batches if not b.strict) + sum(s.used_mb - s.strict_mb for s in slices)
        tags = tag_slices(slices, be_mem_mb, self.slowdown)
        out = Distribution(tags=tags)
        for b in batches:
            chosen = self.place(b, list(state.values()), tags, be_model, strict_expected)
            if chosen is None:
                out.waiting.append(b)
                continue
            s, e = chosen
            out.placements.append(Placement(b, s.id, e))
            state[s.id] = s.with_batch(b.model, b.strict, b.mem_mb)
        return out


def job_distributor(assumptions: Assumptions, *, extended: bool = False) -> JobDistributor:
    """Alg. 1 as the scheduler daemon (`--distribution protean`) and the simulator build it.

    `extended=False` is the paper's Alg. 1 and Eq. 2 (the daemon's, and the simulator's
    `protean_paper`); True adds our extensions (the simulator's `protean`): no BE spill onto
    untagged slices, Eq. 2 with the SM-share term, deadline-aware waiting, and a bound on the
    eta a BE batch may push a running strict batch to (`policy.strict_eta_limit`).
    """
    return JobDistributor(
        assumptions.slowdown,
        be_spill=not extended,
        sm_share=extended,
        deadline_aware=extended,
        protect_strict_eta=float(assumptions.setting("policy", "strict_eta_limit")) if extended else None,
    )
