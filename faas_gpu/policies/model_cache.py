"""Per-unit model cache with LRU replacement (GPU-FaaS paper, §III "Cache Manager").

A unit's GPU memory holds whole models; loading one that does not fit evicts the unit's least
recently used models until it fits. Sizes are the peak occupation at the profiled batch size
(Table I), since exceeding memory would OOM the GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class ModelTooLarge(ValueError):
    """A model that no amount of eviction can fit on this unit."""


class ModelCache:
    def __init__(self, capacity_mb: float, max_models: int | None = None):
        """max_models: most models held at once, whatever memory is left (a unit's worker cap: a
        process per model, and under MPS the server's client limit); None: memory alone decides."""
        if capacity_mb <= 0:
            raise ValueError(f"capacity_mb: must be positive, got {capacity_mb}")
        if max_models is not None and max_models < 1:
            raise ValueError(f"max_models: at least 1, got {max_models}")
        self.capacity_mb = float(capacity_mb)
        self.max_models = max_models
        self._lru: OrderedDict[str, float] = OrderedDict()  # oldest first
        self.used_mb = 0.0

    def __contains__(self, model: str) -> bool:
        return model in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def __iter__(self) -> Iterator[str]:
        """Cached models, least recently used first, without the copy `models` makes."""
        return iter(self._lru)

    @property
    def models(self) -> list[str]:
        """Cached models, least recently used first."""
        return list(self._lru)

    def touch(self, model: str) -> None:
        self._lru.move_to_end(model)

    def evict(self, model: str) -> None:
        """Drop a model outside LRU order (its worker died or was stopped)."""
        self.used_mb -= self._lru.pop(model)

    @property
    def sizes(self) -> dict[str, float]:
        """What each cached model is charged, least recently used first."""
        return dict(self._lru)

    def size_of(self, model: str) -> float:
        """What `model` is charged now (KeyError when it is not cached)."""
        return self._lru[model]

    def resize(self, model: str, size_mb: float) -> list[str]:
        """Charge a cached model its newly measured size (a larger batch grew its activations, or
        a measurement replaced the estimate); returns the other models, least recently used first,
        that must go so that the cache fits its capacity again (already dropped here). The model
        itself stays even when alone it exceeds the capacity: its worker is what says so (OOM)."""
        self.used_mb += float(size_mb) - self._lru[model]
        self._lru[model] = float(size_mb)
        victims = []
        for name in list(self._lru):
            if self.used_mb <= self.capacity_mb:
                break
            if name == model:
                continue
            victims.append(name)
            self.used_mb -= self._lru.pop(name)
        return victims

    def victims_for(self, size_mb: float, max_models: int | None = None) -> list[str]:
        """The LRU models that would be evicted to make room for a new model of `size_mb`, and
        more while the unit would hold over `max_models` (default the cache's own; nothing changes)."""
        if size_mb > self.capacity_mb:
            raise ModelTooLarge(f"model of {size_mb} MB exceeds the unit's {self.capacity_mb} MB")
        free, victims = self.capacity_mb - self.used_mb, []
        for name, size in self._lru.items():
            if free >= size_mb:
                break
            victims.append(name)
            free += size
        cap = self.max_models if max_models is None else max_models
        if cap is not None:
            staying = [name for name in self._lru if name not in victims]
            while staying and len(staying) >= cap:
                victims.append(staying.pop(0))
        return victims

    def load(self, model: str, size_mb: float) -> list[str]:
        """Cache `model` as most recently used; returns the evicted models, LRU first."""
        if model in self._lru:
            self.touch(model)
            return []
        victims = self.victims_for(size_mb)
        for name in victims:
            self.used_mb -= self._lru.pop(name)
        self._lru[model] = float(size_mb)
        self.used_mb += size_mb
        return victims
