"""What Algorithm 1 costs to run as the cluster grows (Fig. 17)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from faas_gpu.policies.infless import Server, schedule

from ..infless_data import candidates
from .model import BETA, Function


@dataclass
class ScheduleCost:
    servers: int
    instances: int
    calls: int
    seconds: float

    @property
    def ms_per_instance(self) -> float:
        return self.seconds * 1000.0 / self.instances if self.instances else 0.0


def schedule_cost(
    functions: Sequence[Function],
    servers: Sequence[Server],
    instances: int,
    *,
    offset: float = 1.10,
    clock: Callable[[], float] = time.perf_counter,
) -> ScheduleCost:
    """Time Algorithm 1 placing `instances` instances of `functions` (each its own SLO) on
    `servers`, one `schedule` call per function per round, as the autoscaler calls it for a
    residual load; the free resources carry over from call to call."""
    cands = {f.name: candidates(f.rows, offset=offset) for f in functions}
    free = list(servers)
    placed = calls = 0
    elapsed = 0.0
    per_call = max(1, instances // (2 * len(functions)))
    while placed < instances:
        progress = False
        for f in functions:
            want = min(per_call, instances - placed)
            if want <= 0:
                break
            cs = cands[f.name]
            top = max((c for c in cs if c.t_exec_s <= f.slo_s / 2 or c.batch == 1), key=lambda c: c.batch, default=None)
            if top is None:
                continue
            rps = want * math.floor(1.0 / top.t_exec_s) * top.batch * 0.8  # mostly big batches, a tail of small
            t0 = clock()
            res = schedule(rps, cs, free, f.slo_s, beta=BETA, max_instances=want)
            elapsed += clock() - t0
            calls += 1
            free = res.servers
            placed += len(res.placements)
            progress = progress or bool(res.placements)
        if not progress:
            break
    return ScheduleCost(len(servers), placed, calls, elapsed)
