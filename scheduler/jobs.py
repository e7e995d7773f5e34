"""A job the scheduler accepted, and the answer its caller gets.

Kept apart from the parts that move a job along (admission, the leader loop, the manager client)
so that each of them and the HTTP route share one record of where the job stands.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobOutcome:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Job:
    id: int
    digest: str
    payload: bytes
    arrival: float
    deadline: float | None
    done: threading.Event = field(default_factory=threading.Event)
    outcome: JobOutcome | None = None
    attempts: int = 0
    queued: bool = True  # waiting (class queue or the policy's queues), not running
    best_effort: bool = False
    admitted: bool = False  # handed to the placement policy
    model: str | None = None  # the model's name (X-Faas-Gpu-Model), for PROTEAN's slowdown specs
    unit: str | None = None  # node/unit it runs on, while it runs
    function: str | None = None  # name.namespace of the function that sent it (None: the cluster)
    abandoned: bool = False  # its caller has gone: not started if it still waits
    rows: int = 1  # the batch's size (its first dimension)
    app: str = ""  # HarmonyBatch's application of the batch, "" for none
    started: float | None = None  # when it was first sent to a unit (the end of its queueing)
    trace: Any = None  # the job route's span (`faas_gpu.tracing.Carried`): its queueing and dispatch spans' parent

    def finish(self, outcome: JobOutcome) -> None:
        self.outcome = outcome
        self.done.set()
