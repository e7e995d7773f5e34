"""The procurement loop body: `Procurer` applies the pure `Procurement` policy's decisions.

One tick: evictions and notices from the cloud, every held node charged, what each node looks like
(ready, cordoned, idle from the GPU Managers' unit reports), the policy's decision, then cordons,
acquisitions and releases applied to the cloud, the datastore and the cost meter. The time is
passed in (`now`, seconds on the cloud's and the price series' axis), so tests drive it tick by
tick.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from faas_gpu.cloud import CloudProvider
from faas_gpu.contract.keys import UNITS
from faas_gpu.cordon import cordon, uncordon
from faas_gpu.datastore import Datastore
from faas_gpu.policies.protean import (
    CostMeter,
    Node,
    NodeKind,
    NodeState,
    Procurement,
    ProcurementDecision,
    ProcurementSnapshot,
)

from .launcher import Launcher

log = logging.getLogger("procure")

UNITS_PREFIX = UNITS  # where the GPU Managers report their units (the contract's key)


@dataclass
class HeldNode:
    node: Node
    charged_to: float
    cordoned_at: float | None = None
    reason: str = ""
    evict_at: float | None = None

    @property
    def id(self) -> str:
        return self.node.id


@dataclass
class Counts:
    acquired: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in NodeKind})
    failed: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in NodeKind})
    notices: int = 0
    evicted: int = 0
    released: int = 0


class Procurer:
    """Applies `Procurement` decisions to a cloud, the datastore and the cost meter, one tick at a time.

    `now` is the daemon's time in seconds (the cloud's and the price series' time axis)."""

    def __init__(
        self,
        datastore: Datastore,
        cloud: CloudProvider,
        policy: Procurement,
        meter: CostMeter,
        *,
        drain_grace_s: float = 2.0,
        require_manager: bool = True,
        status_path: Path | None = None,
        launcher: Launcher | None = None,
        wall: Callable[[], float] = time.time,
    ):
        if drain_grace_s < 0:
            raise ValueError(f"drain_grace_s: must be >= 0, got {drain_grace_s}")
        self.ds, self.cloud, self.policy, self.meter = datastore, cloud, policy, meter
        self.drain_grace_s, self.require_manager = drain_grace_s, require_manager
        self.status_path, self.launcher, self.wall = status_path, launcher, wall
        self.nodes: dict[str, HeldNode] = {}
        self.counts = Counts()
        self.events: deque[dict] = deque(maxlen=100)
        self._failed: list[NodeKind] = []
        self._lock = threading.Lock()
        self._status: dict = {}
        self._now = 0.0

    # -- the loop body -----------------------------------------------------------------------
    def tick(self, now: float) -> ProcurementDecision:
        with self._lock:
            self._now = now
            for nid in self.cloud.evicted(now):
                held = self.nodes.get(nid)
                if held is not None:
                    self.counts.evicted += 1
                    self._gone(held, now, "evicted")
            notices = [n for n in self.cloud.eviction_notices(now) if n.node in self.nodes]
            for n in notices:
                self.counts.notices += 1
                self.nodes[n.node].evict_at = n.evict_at
                self._event(now, "notice", n.node, evictIn=round(n.evict_at - now, 1))
            for held in self.nodes.values():
                self._charge(held, now)
            units = self._units()
            states = [
                NodeState(
                    h.id,
                    h.node.kind,
                    ready=self._ready(h, now, units),
                    cordoned=h.cordoned_at is not None,
                    idle=self._idle(h, now, units),
                )
                for h in self.nodes.values()
            ]
            decision = self.policy.observe(ProcurementSnapshot(states, notices, self._failed), now)
            self._failed = []
            for nid in decision.cordon:
                held = self.nodes.get(nid)
                if held is None or held.cordoned_at is not None:
                    continue
                held.cordoned_at = now
                held.reason = "eviction notice" if held.evict_at is not None else "retired: spot is back"
                extra = {"evictIn": round(held.evict_at - now, 1)} if held.evict_at is not None else {}
                cordon(self.ds, nid, held.reason, **extra)
                self._event(now, "cordon", nid, reason=held.reason)
            for kind in decision.acquire:
                node = self.cloud.acquire(kind, now)
                if node is None:
                    self._failed.append(kind)
                    self.counts.failed[kind.value] += 1
                    self._event(now, "acquire-failed", None, kind=kind.value)
                    continue
                self.nodes[node.id] = HeldNode(node, now)
                self.counts.acquired[kind.value] += 1
                self._event(now, "acquire", node.id, kind=kind.value)
                if self.launcher is not None:
                    self.launcher.start(node.id)
            for nid in decision.release:
                held = self.nodes.get(nid)
                if held is not None:
                    self.cloud.release(nid, now)
                    self.counts.released += 1
                    self._gone(held, now, "release")
        self._write(now)
        return decision

    def close(self, now: float) -> None:
        """A stopped daemon holds no VMs: release every node (charged up to now)."""
        with self._lock:
            for held in list(self.nodes.values()):
                self.cloud.release(held.id, now)
                self.counts.released += 1
                self._gone(held, now, "release")
        self._write(now)

    def _write(self, now: float) -> None:
        with self._lock:
            self._status = self._describe(now)
        if self.status_path is not None:
            tmp = self.status_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._status, indent=1))
            tmp.replace(self.status_path)

    # -- what it sees ------------------------------------------------------------------------
    def _units(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for kv in self.ds.get_prefix(UNITS_PREFIX):
            try:
                body = json.loads(kv.value)
                out.setdefault(body["node"], []).append(body)
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def _ready(self, held: HeldNode, now: float, units: dict[str, list[dict]]) -> bool:
        booted = now >= held.node.ready_at
        return booted and (not self.require_manager or bool(units.get(held.id)))

    def _idle(self, held: HeldNode, now: float, units: dict[str, list[dict]]) -> bool:
        if held.cordoned_at is None or now - held.cordoned_at < self.drain_grace_s:
            return False  # the scheduler may not have seen the cordon yet
        return not any(u.get("state") == "busy" for u in units.get(held.id, []))

    # -- what it does ------------------------------------------------------------------------
    def _charge(self, held: HeldNode, now: float) -> None:
        self.meter.add(held.node.kind, held.charged_to, now)
        held.charged_to = max(held.charged_to, now)

    def _gone(self, held: HeldNode, now: float, event: str) -> None:
        self._charge(held, now)
        self.nodes.pop(held.id, None)
        if self.launcher is not None:
            self.launcher.stop(held.id)
        self.ds.delete_prefix(f"{UNITS_PREFIX}{held.id}/")
        uncordon(self.ds, held.id)
        self._event(now, event, held.id, kind=held.node.kind.value)

    def _event(self, now: float, what: str, node: str | None, **extra: object) -> None:
        entry = {"t": round(now, 3), "event": what, **({"node": node} if node else {}), **extra}
        self.events.append(entry)
        detail = " ".join(f"{k}={v}" for k, v in extra.items())
        log.info("procure: %s %s %s (cost so far $%.4f)", what, node or "", detail, self.meter.total)

    def status(self) -> dict:
        with self._lock:
            return dict(self._status)

    def _describe(self, now: float) -> dict:
        m = self.meter
        od_equivalent = m.on_demand_equivalent()

        def state(h: HeldNode) -> str:
            if h.cordoned_at is not None:
                return "cordoned"
            return "ready" if now >= h.node.ready_at else "booting"

        return {
            "updated": self.wall(),
            "t": round(now, 3),
            "mode": self.policy.mode,
            "targetNodes": self.policy.target_nodes,
            "nodes": [
                {
                    "id": h.id,
                    "kind": h.node.kind.value,
                    "state": state(h),
                    "acquiredAt": round(h.node.requested_at, 3),
                    "readyAt": round(h.node.ready_at, 3),
                    **({"reason": h.reason} if h.cordoned_at is not None else {}),
                    **({"evictAt": round(h.evict_at, 3)} if h.evict_at is not None else {}),
                }
                for h in self.nodes.values()
            ],
            "prices": {
                "spotPerHour": m.spot.at(now),
                "onDemandPerHour": m.on_demand_per_hour,
            },
            "cost": {
                "dollars": {k.value: v for k, v in m.dollars.items()},  # unrounded: a short hold costs micro-dollars
                "nodeSeconds": {k.value: round(v, 3) for k, v in m.node_seconds.items()},
                "total": m.total,
                "onDemandEquivalent": od_equivalent,
                "savings": round(1 - m.total / od_equivalent, 4) if od_equivalent > 0 else 0.0,
            },
            "counts": {
                "acquired": dict(self.counts.acquired),
                "failed": dict(self.counts.failed),
                "notices": self.counts.notices,
                "evicted": self.counts.evicted,
                "released": self.counts.released,
            },
            "events": list(self.events)[-50:],
        }
