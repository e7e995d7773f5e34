"""The unit view: the GPU units placement runs over, the placement policy built on them, and the
units that may take no new work now (holds).

Units come from the GPU Managers' reports in the datastore; those of cordoned nodes
(`faas_gpu.cordon`: a spot node with an eviction notice, one being retired) are left out, so
nothing new is placed there while their running jobs finish. When the set of units changes the
placement policy is rebuilt over it, keeping what each unit that stays has cached.

A unit is held while PROTEAN's GPU Reconfigurator re-slices its GPU (`hold`/`release`), and
rests for `UNAVAILABLE_HOLD_S` after it answered that it is draining or gone (`rest`): either
way it is busy to the placement policy, so nothing new lands on it. The view is guarded by the
scheduler's one lock; its callers hold it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from faas_gpu.contract.keys import UNITS as STATUS_PREFIX
from faas_gpu.cordon import cordoned_nodes
from faas_gpu.datastore import Datastore
from faas_gpu.policies import ModelCache, Unit, make_scheduler
from faas_gpu.policies.protean.mig import GpuModel

from .catalog import ModelCatalog, Placement
from .gpus import gpu_views
from .residency import Gpu

log = logging.getLogger(__name__)
NO_UNITS_TIMEOUT_S = 10.0  # queued jobs fail with 503 when no GPU Manager has reported for this long
UNAVAILABLE_HOLD_S = 2.0  # a unit that said it is draining or gone gets no job for this long


@dataclass(frozen=True)
class UnitRef:
    key: str  # node/unit
    node: str
    unit: str
    url: str
    memory_mb: float
    profile: str | None = None  # MIG profile ("4g.20gb"); None for a whole GPU or a CPU
    max_models: int | None = None  # the manager's worker cap for the unit: it evicts beyond it


@dataclass(frozen=True)
class UnitReports:
    """One read of the managers' reports, made outside the lock (`seq` orders reads)."""

    seq: int
    found: list[UnitRef]  # the units placement may use, sorted by key
    cordoned: dict[str, dict]  # node -> what its cordon key says
    unit_gpu: dict[str, Gpu]  # node/unit key -> its GPU, for MIG units of the GPU model asked for
    overhead_mb: float = 0.0  # the largest per-process overhead a manager charges before measuring
    measured_mb: dict[str, float] = field(default_factory=dict)  # per model: the largest measured cost


class Refresh(Enum):
    """What a read of the reports changed for placement."""

    KEPT = "kept"  # a stale read, or the same units
    NO_UNITS = "no units"  # no unit reported: jobs wait
    TIMED_OUT = "timed out"  # ... for longer than `no_units_timeout_s`: waiting jobs should fail
    REBUILT = "rebuilt"  # the policy was rebuilt over new units: admitted jobs must be carried over


def read_reports(ds: Datastore, seq: int, gpu_model: GpuModel | None) -> UnitReports:
    """The units reported, but cordoned nodes'; with a `gpu_model` (PROTEAN's distributor), also
    which GPU of that model each MIG unit is a slice of."""
    found, reports = [], []
    overhead, measured = 0.0, {}
    cordoned = cordoned_nodes(ds)
    for kv in ds.get_prefix(STATUS_PREFIX):
        try:
            s = json.loads(kv.value)
            reports.append(s)
            if s["node"] in cordoned:
                continue
            key = f"{s['node']}/{s['unit']}"
            cap = s.get("max_models")
            found.append(
                UnitRef(
                    key,
                    s["node"],
                    s["unit"],
                    s["url"],
                    float(s["memory_mb"]),
                    s.get("profile"),
                    int(cap) if cap is not None and int(cap) >= 1 else None,
                )
            )
            overhead = max(overhead, float(s.get("overhead_mb") or 0.0))
            for digest, mb in (s.get("measured_mb") or {}).items():
                measured[digest] = max(float(mb), measured.get(digest, 0.0))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring a malformed unit report at %s", kv.key)
    found.sort(key=lambda u: u.key)
    views = gpu_views(reports, gpu_model)[0] if gpu_model is not None else {}
    unit_gpu = {k: g for g, v in views.items() for k in v.units}
    return UnitReports(seq, found, cordoned, unit_gpu, overhead, measured)


def _shape(u: UnitRef) -> tuple:
    """What placement's view of a unit is built from: a change in any rebuilds it."""
    return (u.key, u.memory_mb, u.max_models)


class UnitView:
    def __init__(
        self,
        ds: Datastore,
        clock: Callable[[], float],
        policy_name: str = "lalb_o3",
        o3_limit: int = 25,
        no_units_timeout_s: float = NO_UNITS_TIMEOUT_S,
    ):
        self.ds, self.clock = ds, clock
        self.policy_name, self.o3_limit, self.no_units_timeout_s = policy_name, o3_limit, no_units_timeout_s
        self.units: list[UnitRef] = []
        self.policy: Placement | None = None
        self.unit_gpu: dict[str, Gpu] = {}  # node/unit key -> its GPU, for MIG units of the distributor's GPU
        self.held: set[str] = set()  # node/unit keys of units whose GPU is being reconfigured
        self.held_until: dict[str, float] = {}  # units that said they are draining or gone: until when
        self.no_units_since: float | None = None
        self._refresh_seq = self._refresh_applied = 0  # a stale read of the reports never wins

    # -- the units, from the reports -------------------------------------------------------
    def next_read(self) -> int:
        """The sequence number of a read about to start (under the lock)."""
        self._refresh_seq += 1
        return self._refresh_seq

    def read(self, seq: int, gpu_model: GpuModel | None) -> UnitReports:
        """The managers' reports now (outside the lock: the datastore may be slow)."""
        return read_reports(self.ds, seq, gpu_model)

    def apply(self, read: UnitReports, catalog: ModelCatalog) -> Refresh:
        """Take a read in (under the lock); a read that began before one already applied is dropped."""
        if read.seq < self._refresh_applied:
            return Refresh.KEPT
        self._refresh_applied = read.seq
        self.unit_gpu = read.unit_gpu
        catalog.reported(read.overhead_mb, read.measured_mb, self.policy)
        found = read.found
        if not found and any(u.node in read.cordoned for u in self.units):
            self.clear()  # every unit left is cordoned: jobs wait for a new one
        if not found:
            self.no_units_since = self.no_units_since or self.clock()
            if self.clock() - self.no_units_since > self.no_units_timeout_s:
                return Refresh.TIMED_OUT
            return Refresh.NO_UNITS
        self.no_units_since = None
        if [_shape(u) for u in found] == [_shape(u) for u in self.units]:
            return Refresh.KEPT
        self.rebuild(found, catalog)
        return Refresh.REBUILT

    def clear(self) -> None:
        """No unit to place on: the policy is rebuilt when a manager reports again."""
        self.units, self.policy = [], None

    def rebuild(self, found: list[UnitRef], catalog: ModelCatalog) -> Placement:
        """A placement policy over `found` that knows the catalog's models and what each unit
        that stays has cached (queued jobs are the caller's to carry over)."""
        old_policy, old_units = self.policy, self.units
        self.units = found
        self.policy = policy = make_scheduler(
            self.policy_name,
            [Unit(id=i, cache=ModelCache(u.memory_mb, u.max_models)) for i, u in enumerate(found)],
            {},
            self.o3_limit,
        )
        catalog.add_all_to(policy)
        if old_policy is not None:  # carry what was cached into the new view
            index = {u.key: i for i, u in enumerate(found)}
            for i, u in enumerate(old_units):
                if u.key in index:
                    new_unit = policy.units[index[u.key]]
                    for name in old_policy.units[i].cache.models:
                        for gone in new_unit.cache.load(name, catalog.models[name].size_mb):  # a smaller unit or cap
                            policy.holders.get(gone, set()).discard(new_unit.id)
                        policy.holders.setdefault(name, set()).add(new_unit.id)
        return policy

    def forget(self, unit: UnitRef) -> None:
        """A manager that does not answer loses its units until it reports again."""
        self.ds.delete(f"{STATUS_PREFIX}{unit.key}")

    def is_current(self, index: int, unit: UnitRef) -> bool:
        """`unit` is still the policy's unit `index` (the view may have been rebuilt since)."""
        return bool(self.policy is not None and self.units and index < len(self.units) and self.units[index] == unit)

    def local_jobs(self) -> dict[int, str]:
        """Job id -> node/unit key of every job waiting in a unit's local queue."""
        local: dict[int, str] = {}
        if self.policy is not None:
            for i, u in self.policy.units.items():
                for r in u.local_queue:
                    if i < len(self.units):
                        local[r.id] = self.units[i].key
        return local

    # -- holds -----------------------------------------------------------------------------
    def unavailable(self) -> set[str]:
        """Keys of the units that take no new work now: held, or resting after a refusal."""
        return self.held | set(self.held_until)

    def hold(self, keys: set[str]) -> None:
        self.held |= set(keys)
        self.apply_holds()

    def release(self, keys: set[str]) -> None:
        self.held -= set(keys)
        self._unhold(set(keys) - set(self.held_until))

    def rest(self, key: str) -> None:
        """The unit said it is draining or gone: no job for it for a while."""
        self.held_until[key] = self.clock() + UNAVAILABLE_HOLD_S

    def _unhold(self, keys: set[str]) -> None:
        if self.policy is None:
            return
        for i, u in enumerate(self.units):
            if u.key in keys and self.policy.units[i].running is None:
                self.policy.idle.add(i)

    def apply_holds(self) -> None:
        """A held unit is busy to the placement policy (it may come back idle after each completion)."""
        now = self.clock()
        expired = {k for k, until in self.held_until.items() if until <= now}
        for k in expired:
            del self.held_until[k]
        self._unhold(expired - self.held)
        held = self.unavailable()
        if self.policy is None or not held:
            return
        for i, u in enumerate(self.units):
            if u.key in held:
                self.policy.idle.discard(i)
