"""MIG geometries as data: which slices a GPU can be cut into (PROTEAN §2.2, Table 2).

A *geometry* is the multiset of GPU-instance profiles a GPU is sliced into, e.g. (4g, 2g, 1g).
Not every multiset fits: each profile may only start at certain memory slices (NVIDIA's MIG
user guide, "placements"), so (4g, 3g) is valid while (4g, 4g) and (3g, 2g, 2g, 1g) are not.
The policies (Job Distribution, the Reconfigurator) only ever name geometries; this module says
which are valid, and why not when one is not.

The profile table is data handed in: `faas_gpu.policy_data.protean.gpu_models()` reads the packaged
`mig_profiles.yaml` (A100-40GB, H100-80GB) through `gpu_models_from_data`. On a live GPU the same
table is built from NVML's profile info (`nvmlDeviceGetGpuInstanceProfileInfo` and its possible
placements) with `GpuModel.from_profiles(name, profiles)`: any objects with `name`, `slices`,
`memory_mb`, `max_count` and `placements` ((start, size) pairs) will do, so the GPU Manager's
own profile records can be passed as they are.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Geometry = tuple[str, ...]  # profile keys, largest first: ("4g", "2g", "1g")


class ProfileLike(Protocol):
    name: str
    slices: int
    memory_mb: int
    max_count: int
    placements: Sequence[tuple[int, int]]


@dataclass(frozen=True)
class ProfileInfo:
    """One GPU-instance profile: what NVML's profile info and possible placements say of it."""

    name: str  # "3g.20gb"
    slices: int  # compute slices
    memory_mb: int
    max_count: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices
    multiprocessors: int = 0
    alias: str | None = None  # "3g": the paper's short name, for the default profile of that size

    @property
    def key(self) -> str:
        """The name geometries use: the alias where there is one."""
        return self.alias or self.name


class InvalidGeometry(ValueError):
    """A geometry the GPU cannot take; the message lists the geometries it can."""

    def __init__(self, gpu: str, geometry: Sequence[str], reason: str, valid: Sequence[Geometry]):
        self.gpu, self.geometry, self.reason = gpu, tuple(geometry), reason
        self.valid_geometries = [tuple(g) for g in valid]
        shown = " ".join(f"({', '.join(g)})" for g in self.valid_geometries)
        super().__init__(f"invalid MIG geometry ({', '.join(geometry)}) for {gpu}: {reason}. Valid geometries: {shown}")


@dataclass(frozen=True)
class GpuModel:
    """A GPU model's MIG profile table, and the geometries it allows."""

    name: str
    profiles: tuple[ProfileInfo, ...]  # largest first
    compute_slices: int = 7
    memory_slices: int = 8
    _by_key: Mapping[str, ProfileInfo] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_key: dict[str, ProfileInfo] = {}
        for p in self.profiles:
            if p.slices <= 0 or p.memory_mb <= 0 or p.max_count <= 0:
                raise ValueError(f"{self.name}: profile {p.name}: slices, memory_mb and max_count must be > 0")
            for start, size in p.placements:
                if start < 0 or size <= 0 or start + size > self.memory_slices:
                    raise ValueError(f"{self.name}: profile {p.name}: placement ({start}, {size}) is off the GPU")
            for k in {p.key, p.name}:
                if k in by_key and by_key[k] is not p:
                    raise ValueError(f"{self.name}: two profiles are called {k!r}")
                by_key[k] = p
        object.__setattr__(self, "_by_key", by_key)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_profiles(
        cls,
        name: str,
        profiles: Iterable[ProfileLike | Mapping[str, Any]],
        compute_slices: int = 7,
        memory_slices: int = 8,
    ) -> GpuModel:
        """From NVML's profile info (or any records with the same fields).

        Aliases ("1g", "2g", ...) go to the profile of each size that NVML can make the most of
        (1g.5gb rather than 1g.10gb on an A100-40GB), so geometries read as the paper's.
        """
        infos = []
        for p in profiles:
            get = p.get if isinstance(p, Mapping) else lambda k, d=None, _p=p: getattr(_p, k, d)
            infos.append(
                ProfileInfo(
                    name=str(get("name")),
                    slices=int(get("slices")),
                    memory_mb=int(get("memory_mb")),
                    max_count=int(get("max_count")),
                    placements=tuple((int(s), int(z)) for s, z in get("placements", ()) or ()),
                    multiprocessors=int(get("multiprocessors", 0) or 0),
                    alias=get("alias"),
                )
            )
        if not any(i.alias for i in infos):
            best: dict[int, ProfileInfo] = {}
            for i in infos:
                if "+" in i.name or "#" in i.name:  # media-extension and duplicate variants
                    continue
                cur = best.get(i.slices)
                if cur is None or (i.max_count, -i.memory_mb) > (cur.max_count, -cur.memory_mb):
                    best[i.slices] = i
            chosen = {id(i) for i in best.values()}
            infos = [
                ProfileInfo(
                    i.name,
                    i.slices,
                    i.memory_mb,
                    i.max_count,
                    i.placements,
                    i.multiprocessors,
                    f"{i.slices}g" if id(i) in chosen else None,
                )
                for i in infos
            ]
        infos.sort(key=lambda i: (-i.slices, -i.memory_mb, i.name))
        return cls(name, tuple(infos), compute_slices, memory_slices)

    # -- profiles -----------------------------------------------------------------------------

    def profile(self, key: str) -> ProfileInfo:
        try:
            return self._by_key[key]
        except KeyError:
            known = ", ".join(p.key for p in self.profiles)
            raise InvalidGeometry(
                self.name, (key,), f"unknown profile {key!r} (profiles: {known})", self.valid_geometries()
            ) from None

    def compute_fraction(self, key: str) -> float:
        return self.profile(key).slices / self.compute_slices

    def memory_mb(self, key: str) -> int:
        return self.profile(key).memory_mb

    @property
    def whole(self) -> str:
        """The key of the whole-GPU profile (7g)."""
        return max(self.profiles, key=lambda p: (p.slices, p.memory_mb)).key

    # -- geometries ---------------------------------------------------------------------------

    def normalize(self, geometry: Sequence[str] | str) -> Geometry:
        """Keys, largest first; "4g+2g+1g", "4g,2g,1g" and ["4g.20gb", "2g", "1g"] all give ("4g", "2g", "1g")."""
        names = [n for n in re.split(r"[\s,+]+", geometry) if n] if isinstance(geometry, str) else list(geometry)
        if not names:
            raise InvalidGeometry(self.name, (), "a geometry needs at least one slice", self.valid_geometries())
        rank = {p.key: i for i, p in enumerate(self.profiles)}
        return tuple(sorted((self.profile(n).key for n in names), key=lambda k: rank[k]))

    def place(self, geometry: Sequence[str] | str) -> tuple[tuple[str, int, int], ...] | None:
        """Non-overlapping placements (key, start, size) for the geometry, largest first; None if none."""
        keys = self.normalize(geometry)
        counts = Counter(keys)
        if any(n > self.profile(k).max_count for k, n in counts.items()):
            return None
        if sum(self.profile(k).slices for k in keys) > self.compute_slices:
            return None
        return _assign([self.profile(k) for k in keys])

    def is_valid(self, geometry: Sequence[str] | str) -> bool:
        try:
            return self.place(geometry) is not None
        except InvalidGeometry:
            return False

    def validate(self, geometry: Sequence[str] | str) -> Geometry:
        """The geometry normalized, or InvalidGeometry naming the reason and every valid geometry."""
        keys = self.normalize(geometry)
        for k, n in Counter(keys).items():
            if n > self.profile(k).max_count:
                raise InvalidGeometry(
                    self.name, keys, f"{n} x {k} (at most {self.profile(k).max_count})", self.valid_geometries()
                )
        used = sum(self.profile(k).slices for k in keys)
        if used > self.compute_slices:
            raise InvalidGeometry(
                self.name, keys, f"{used} compute slices (the GPU has {self.compute_slices})", self.valid_geometries()
            )
        if _assign([self.profile(k) for k in keys]) is None:
            raise InvalidGeometry(self.name, keys, "the slices' placements overlap", self.valid_geometries())
        return keys

    def valid_geometries(self, full_only: bool = True) -> list[Geometry]:
        """Every geometry the GPU can take, largest slices first; `full_only`: those no slice can be added to."""
        return list(_geometries(self.profiles, self.compute_slices, full_only))


def _assign(profiles: list[ProfileInfo]) -> tuple[tuple[str, int, int], ...] | None:
    """Backtracking placement, largest profile first (a handful of slices: cheap)."""
    chosen: list[tuple[str, int, int]] = []

    def free(start: int, size: int) -> bool:
        return all(start + size <= s or s + z <= start for _, s, z in chosen)

    def go(i: int, low: int) -> bool:
        if i == len(profiles):
            return True
        p = profiles[i]
        same_as_prev = i > 0 and profiles[i - 1] is p
        for start, size in p.placements:
            if same_as_prev and start < low:  # each set of equal profiles once, in increasing starts
                continue
            if free(start, size):
                chosen.append((p.key, start, size))
                if go(i + 1, start + 1):
                    return True
                chosen.pop()
        return False

    return tuple(chosen) if go(0, 0) else None


@functools.lru_cache(maxsize=16)
def _geometries(profiles: tuple[ProfileInfo, ...], compute_slices: int, full_only: bool) -> tuple[Geometry, ...]:
    found: set[Geometry] = set()

    def grow(first: int, low: int, taken: list[tuple[int, int]], keys: list[str], used: int) -> None:
        # each packing once: profiles in table order, one profile's placements in increasing order
        if keys:
            found.add(tuple(keys))
        for k in range(first, len(profiles)):
            p = profiles[k]
            if keys.count(p.key) >= p.max_count or used + p.slices > compute_slices:
                continue
            for j in range(low if k == first else 0, len(p.placements)):
                start, size = p.placements[j]
                if all(start + size <= s or s + z <= start for s, z in taken):
                    grow(k, j + 1, [*taken, (start, size)], [*keys, p.key], used + p.slices)

    grow(0, 0, [], [], 0)
    rank = {p.key: i for i, p in enumerate(profiles)}

    def plus(g: Geometry, key: str) -> Geometry:
        return tuple(sorted((*g, key), key=lambda n: rank[n]))

    out = [g for g in found if not full_only or not any(plus(g, p.key) in found for p in profiles)]
    return tuple(sorted(out, key=lambda g: [rank[n] for n in g]))


def gpu_models_from_data(data: Mapping[str, Any]) -> dict[str, GpuModel]:
    """The GPU models of a profile table (`mig_profiles.yaml`'s shape, parsed), by name."""
    return {
        name: GpuModel.from_profiles(
            name, spec["profiles"], int(spec.get("compute_slices", 7)), int(spec.get("memory_slices", 8))
        )
        for name, spec in data.items()
    }
