"""The models placement knows: their size from the artifacts uploaded here, their load and run
times learnt from the GPU Managers' answers.

Apart from the unit view because it changes for another reason: how a model's cost is estimated
(the defaults, the EWMA) is not where units come from. Every model here is also known to the
current placement policy; the policy is passed in, since the unit view rebuilds it.
"""

from __future__ import annotations

from faas_gpu.contract.errors import ModelNotUploaded
from faas_gpu.models import ModelStore
from faas_gpu.policies import LALBScheduler, LBScheduler, Model, PlacementError

DEFAULT_LOAD_S = 1.0
DEFAULT_INFER_S = 0.05
EWMA = 0.3

Placement = LALBScheduler | LBScheduler  # what `faas_gpu.policies.make_scheduler` builds


class ModelCatalog:
    def __init__(self, store: ModelStore):
        self.store = store
        self.models: dict[str, Model] = {}

    def get(self, digest: str, policy: Placement | None) -> Model:
        """The model of `digest`, learnt from its uploaded artifact the first time (ModelNotUploaded,
        a LookupError, when it was never uploaded; PlacementError when no unit can hold it)."""
        model = self.models.get(digest)
        if model is None:
            artifact = self.store.get(digest)
            if artifact is None:
                raise ModelNotUploaded(f"model: {digest[:12]}… has not been uploaded")
            model = Model(digest, artifact.size / 2**20, DEFAULT_LOAD_S, DEFAULT_INFER_S)
            self.learn(model, policy)
        return model

    def learn(self, model: Model, policy: Placement | None) -> None:
        if policy is not None:
            policy.add_model(model)  # raises PlacementError for a model no unit can hold
        self.models[model.name] = model

    def observe(self, digest: str, policy: Placement | None, cache_hit: bool, load_s: float, exec_s: float) -> None:
        """A manager ran a job of `digest`: move the estimates towards what it measured (a cache
        hit says nothing of the load time)."""
        m = self.models[digest]
        load = m.load_s if cache_hit else (1 - EWMA) * m.load_s + EWMA * load_s
        self.learn(Model(m.name, m.size_mb, load, (1 - EWMA) * m.infer_s + EWMA * exec_s), policy)

    def add_all_to(self, policy: Placement) -> None:
        """Teach a rebuilt policy every model; one that no unit left can hold is forgotten."""
        for model in list(self.models.values()):
            try:
                policy.add_model(model)
            except PlacementError:  # the units that could hold it are gone
                del self.models[model.name]

    def longest_load_s(self) -> float:
        return max((m.load_s for m in self.models.values()), default=DEFAULT_LOAD_S)
