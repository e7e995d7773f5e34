"""Planning a MIG geometry, pure: which full geometries a GPU's profile table allows, and the
fewest changes from the GPU instances that exist now to a target (kept instances stay, with their
MIG device UUIDs). Nothing here calls NVML: the profile table and the instances come in as data
(`reading`), and the plan goes out to be applied (`acting`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Profile:
    """A GPU-instance profile as this GPU reports it."""

    name: str  # "3g.20gb"
    id: int  # the profile id NVML creates instances of (not the NVML_GPU_INSTANCE_PROFILE_* constant)
    nvml_profile: str  # which NVML_GPU_INSTANCE_PROFILE_* it is, e.g. "3_SLICE"
    slices: int  # compute slices
    memory_mb: int
    max_count: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices
    multiprocessors: int = 0

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "id": self.id,
            "nvml_profile": self.nvml_profile,
            "slices": self.slices,
            "memory_mb": self.memory_mb,
            "max_count": self.max_count,
            "multiprocessors": self.multiprocessors,
            "placements": [{"start": s, "size": z} for s, z in self.placements],
        }


@dataclass(frozen=True)
class Instance:
    """A GPU instance that exists now, with its compute instances."""

    id: int
    profile: str
    start: int
    size: int
    compute: tuple[int, ...] = ()  # the slices of each compute instance
    handle: Any = field(default=None, compare=False, repr=False)
    ci_handles: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def reusable(self, profiles: dict[str, Profile]) -> bool:
        """One full-slice compute instance (a unit as we make them), or none yet (we add it)."""
        return self.compute in ((), (profiles[self.profile].slices,))


@dataclass(frozen=True)
class Plan:
    keep: tuple[Instance, ...]
    destroy: tuple[Instance, ...]
    create: tuple[tuple[Profile, int, int], ...]  # (profile, start, size), largest first

    @property
    def changes(self) -> bool:
        return bool(self.destroy or self.create or any(not i.compute for i in self.keep))


class InvalidGeometry(ValueError):
    """A geometry this GPU cannot take; carries what it can."""

    def __init__(self, index: int, reason: str, profiles: dict[str, Profile]):
        self.index, self.reason = index, reason
        self.valid_profiles = {p.name: p.max_count for p in by_size(profiles)}
        self.valid_geometries = valid_geometries(profiles)
        counts = ", ".join(f"{n} (up to {c})" for n, c in self.valid_profiles.items()) or "none (MIG off?)"
        shown = " ".join(f"[{', '.join(g)}]" for g in self.valid_geometries[:12])
        more = f" … and {len(self.valid_geometries) - 12} more" if len(self.valid_geometries) > 12 else ""
        super().__init__(
            f"gpu {index}: invalid MIG geometry: {reason}. Profiles: {counts}. Valid full geometries: {shown}{more}"
        )

    def to_json(self) -> dict:
        return {
            "error": str(self),
            "gpu": self.index,
            "valid_profiles": self.valid_profiles,
            "valid_geometries": self.valid_geometries,
        }


def by_size(profiles: dict[str, Profile]) -> list[Profile]:
    return sorted(profiles.values(), key=lambda p: (-p.slices, -p.memory_mb, p.name))


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _free(span: tuple[int, int], taken: list[tuple[int, int]]) -> bool:
    return all(not _overlaps(span, t) for t in taken)


def valid_geometries(profiles: dict[str, Profile]) -> list[list[str]]:
    """Every full geometry of the GPU: a packing to which no further instance can be added."""
    order = by_size(profiles)
    found: set[tuple[str, ...]] = set()

    def grow(first: int, low: int, taken: list[tuple[int, int]], names: list[str]) -> None:
        # every packing once: instances in profile order, a profile's placements in increasing order
        found.add(tuple(names))
        for k in range(first, len(order)):
            p = order[k]
            if names.count(p.name) >= p.max_count:
                continue
            for j in range(low if k == first else 0, len(p.placements)):
                if _free(p.placements[j], taken):
                    grow(k, j + 1, [*taken, p.placements[j]], [*names, p.name])

    grow(0, 0, [], [])
    rank = {p.name: i for i, p in enumerate(order)}

    def bigger(g: tuple[str, ...], extra: str) -> tuple[str, ...]:
        return tuple(sorted([*g, extra], key=lambda n: rank[n]))

    full = [g for g in found if g and not any(bigger(g, p.name) in found for p in order)]
    return [list(g) for g in sorted(full, key=lambda g: [rank[n] for n in g])]


def plan_geometry(profiles: dict[str, Profile], current: list[Instance], target: list[str], index: int = 0) -> Plan:
    """The plan that reaches `target` keeping the most current GPU instances; InvalidGeometry if none."""
    unknown = [n for n in target if n not in profiles]
    if unknown:
        raise InvalidGeometry(index, f"unknown profile(s) {', '.join(map(repr, unknown))}", profiles)
    counts = Counter(target)
    over = [f"{n} x{c} (at most {profiles[n].max_count})" for n, c in counts.items() if c > profiles[n].max_count]
    if over:
        raise InvalidGeometry(index, f"too many instances: {', '.join(over)}", profiles)
    rank = {p.name: i for i, p in enumerate(by_size(profiles))}
    items = sorted(target, key=lambda n: rank[n])
    reusable = [i for i in current if i.reusable(profiles)]
    # per profile, the options: an existing instance to keep, or a placement to create at
    options: dict[str, list[tuple[Instance | None, tuple[int, int]]]] = {
        n: [(i, (i.start, i.size)) for i in reusable if i.profile == n]
        + [(None, span) for span in profiles[n].placements]
        for n in counts
    }
    best: list[tuple[Instance | None, tuple[int, int]]] | None = None
    best_kept = -1
    most = sum(min(c, len([i for i in reusable if i.profile == n])) for n, c in counts.items())

    def search(k: int, low: int, chosen: list[tuple[Instance | None, tuple[int, int]]]) -> bool:
        nonlocal best, best_kept
        if k == len(items):
            kept = sum(1 for inst, _ in chosen if inst is not None)
            if kept > best_kept:
                best, best_kept = list(chosen), kept
            return best_kept == most  # nothing can keep more: stop
        name = items[k]
        start = low if k > 0 and items[k - 1] == name else 0  # same profile: no permutations
        for j in range(start, len(options[name])):
            inst, span = options[name][j]
            if any(inst is not None and inst is other for other, _ in chosen):
                continue
            if _free(span, [s for _, s in chosen]) and search(k + 1, j + 1, [*chosen, (inst, span)]):
                return True
        return False

    search(0, 0, [])
    if best is None:
        raise InvalidGeometry(index, f"[{', '.join(items)}] do not fit together on this GPU", profiles)
    keep = tuple(inst for inst, _ in best if inst is not None)
    kept_ids = {i.id for i in keep}
    create = tuple((profiles[n], span[0], span[1]) for n, (inst, span) in zip(items, best, strict=True) if inst is None)
    return Plan(keep=keep, destroy=tuple(i for i in current if i.id not in kept_ids), create=create)
