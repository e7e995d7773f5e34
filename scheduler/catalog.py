"""The models placement knows: their size, their load and run times learnt from the GPU Managers.

A model's size is what it costs on a unit, as the managers measured it (its worker's CUDA context,
weights and peak activations: `X-Faas-Gpu-Model-Mb` on each answer, `measured_mb` in the units'
reports), the largest figure seen; before any measurement, its artifact's size plus the
per-process overhead the managers state (`overhead_mb` in their reports: a CUDA context).

Apart from the unit view because it changes for another reason: how a model's cost is estimated
(the defaults, the EWMA) is not where units come from. Every model here is also known to the
current placement policy; the policy is passed in, since the unit view rebuilds it.
"""

from __future__ import annotations

import logging

from faas_gpu.contract.errors import ModelNotUploaded
from faas_gpu.models import ModelStore
from faas_gpu.policies import LALBScheduler, LBScheduler, Model, PlacementError

log = logging.getLogger(__name__)

DEFAULT_LOAD_S = 1.0
DEFAULT_INFER_S = 0.05
EWMA = 0.3

Placement = LALBScheduler | LBScheduler  # what `faas_gpu.policies.make_scheduler` builds


class ModelCatalog:
    def __init__(self, store: ModelStore):
        self.store = store
        self.models: dict[str, Model] = {}
        self.measured_mb: dict[str, float] = {}  # per model: the largest cost a manager measured
        self.overhead_mb = 0.0  # per-process overhead the managers charge before a measurement

    def size_mb(self, digest: str, artifact_size: int) -> float:
        """What placement charges a model: measured where known, else artifact plus overhead."""
        known = self.measured_mb.get(digest)
        return known if known is not None else artifact_size / 2**20 + self.overhead_mb

    def get(self, digest: str, policy: Placement | None) -> Model:
        """The model of `digest`, learnt from its uploaded artifact the first time (ModelNotUploaded,
        a LookupError, when it was never uploaded; PlacementError when no unit can hold it)."""
        model = self.models.get(digest)
        if model is None:
            artifact = self.store.get(digest)
            if artifact is None:
                raise ModelNotUploaded(f"model: {digest[:12]}… has not been uploaded")
            model = Model(digest, self.size_mb(digest, artifact.size), DEFAULT_LOAD_S, DEFAULT_INFER_S)
            self.learn(model, policy)
        return model

    def learn(self, model: Model, policy: Placement | None) -> None:
        if policy is not None:
            policy.add_model(model)  # raises PlacementError for a model no unit can hold
        self.models[model.name] = model

    def observe(
        self,
        digest: str,
        policy: Placement | None,
        cache_hit: bool,
        load_s: float,
        exec_s: float,
        model_mb: float | None = None,
    ) -> None:
        """A manager ran a job of `digest`: move the estimates towards what it measured (a cache
        hit says nothing of the load time); `model_mb`, its measured cost on the unit."""
        m = self.models[digest]
        if model_mb is not None and model_mb > 0:
            self.measured_mb[digest] = max(model_mb, self.measured_mb.get(digest, 0.0))
        size = self.measured_mb.get(digest, m.size_mb)
        load = m.load_s if cache_hit else (1 - EWMA) * m.load_s + EWMA * load_s
        self._relearn(Model(m.name, size, load, (1 - EWMA) * m.infer_s + EWMA * exec_s), policy)

    def outgrew(self, digest: str, unit_mb: float, policy: Placement | None) -> bool:
        """A manager answered that `digest` does not fit a unit of `unit_mb` even alone (507):
        it needs more than that unit, a lower bound the placement keeps from now on. False when
        no unit is larger (the caller keeps the 507)."""
        m = self.models.get(digest)
        if m is None or policy is None:
            return False
        at_least = max(m.size_mb, unit_mb + 1.0)
        try:
            self.learn(Model(m.name, at_least, m.load_s, m.infer_s), policy)
        except PlacementError:  # no unit is larger
            return False
        self.measured_mb[digest] = max(at_least, self.measured_mb.get(digest, 0.0))
        return True

    def reported(self, overhead_mb: float, measured_mb: dict[str, float], policy: Placement | None) -> None:
        """The managers' reports: their per-process overhead, and what they measured per model
        (models run on leased units too, which the scheduler's answers never show)."""
        self.overhead_mb = max(0.0, overhead_mb)
        for digest, mb in measured_mb.items():
            if mb <= self.measured_mb.get(digest, 0.0):
                continue
            self.measured_mb[digest] = mb
            m = self.models.get(digest)
            if m is not None:
                self._relearn(Model(m.name, mb, m.load_s, m.infer_s), policy)

    def _relearn(self, model: Model, policy: Placement | None) -> None:
        """A known model's new figures; one grown past every unit keeps its old size in the
        policy (the manager answers 507 when it does not fit), and is logged."""
        try:
            self.learn(model, policy)
        except PlacementError as exc:
            log.warning("model %s: %s; placing it on its previous size", model.name[:12], exc)

    def add_all_to(self, policy: Placement) -> None:
        """Teach a rebuilt policy every model; one that no unit left can hold is forgotten."""
        for model in list(self.models.values()):
            try:
                policy.add_model(model)
            except PlacementError:  # the units that could hold it are gone
                del self.models[model.name]

    def longest_load_s(self) -> float:
        return max((m.load_s for m in self.models.values()), default=DEFAULT_LOAD_S)
