"""The state the PROTEAN simulation moves around: batches (`Job`), the GPU units they run on, the
containers of each model on a node, and the nodes with their queue and autoscaler."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import simpy

from faas_gpu.policies.protean import ClassQueue, NodeKind, ProteanScaling


@dataclass
class Job:
    id: int
    model: str
    strict: bool
    arrival: float
    deadline: float | None
    mem_mb: float
    work: float  # execution time alone on 7g (s), this batch's draw
    remaining: float = 0.0
    rate: float = 0.0
    node: int = -1
    unit: int = -1
    start: float = math.nan
    end: float = math.nan
    profile: str = ""


@dataclass
class Unit:
    id: int
    node: int
    profile: str
    memory_mb: float
    exclusive: bool  # time-shared: one batch at a time
    jobs: list[Job] = field(default_factory=list)
    used_mb: float = 0.0
    last: float = 0.0
    wake: simpy.Event | None = None
    gone: bool = False


@dataclass
class Containers:
    warm: int = 0
    busy: int = 0
    starting: int = 0


@dataclass
class Node:
    id: int
    state: str  # ready | draining | reconfiguring | booting | cordoned | gone
    geometry: tuple[str, ...]
    units: list[Unit]
    queue: ClassQueue[Job] | deque[Job]
    scaler: ProteanScaling
    containers: dict[str, Containers] = field(default_factory=dict)
    running: int = 0
    last_assigned: float = -1.0
    be_model: str | None = None
    resident: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})  # by strict
    waiting: dict[str, int] = field(default_factory=dict)  # queued batches by model (kept, not counted)
    queued_be_mb: float = 0.0  # memory of the queued best-effort batches
    area: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    area_t: float = 0.0
    target: tuple[str, ...] | None = None
    strict_pred: float = 0.0  # EWMA of strict batches resident (PROTEAN's strict reservation)
    cloud_id: str | None = None
    kind: NodeKind = NodeKind.ON_DEMAND
    since: float = 0.0  # when the current geometry was set
    acquired_at: float = 0.0  # when the node was bought (cost)

    @property
    def outstanding(self) -> int:
        return self.running + len(self.queue)
