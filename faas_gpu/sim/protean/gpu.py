"""How a GPU behaves: the simulation's ground truth (`assumptions.yaml` > simulator.contention).

n batches that share a unit through MPS progress at rate 1 / (RDF x max(1, sum d, sum FBR) x
(1 + k (n - 1))), re-rated whenever a batch starts or ends; a time-shared GPU runs one batch at
rate 1 / RDF. The policies never see this formula: PROTEAN plans with Eq. 2 (or its SM-share
extension) only, so it lives here, apart from everything that decides.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from faas_gpu.policies.protean import SlowdownModel

from .model import Job, Unit


class Gpus:
    """Every unit of the cluster (whole GPUs and MIG slices) and one simpy process per unit that
    runs its batches; `on_done(job)` is called as each batch ends."""

    def __init__(
        self,
        env: simpy.Environment,
        slowdown: SlowdownModel,
        corunner_overhead: float,
        *,
        exclusive: bool,
        on_done: Callable[[Job], None],
    ):
        self.env, self.sd, self.corunner_overhead = env, slowdown, corunner_overhead
        self.exclusive = exclusive  # time-shared: one batch at a time (Molecule's beta)
        self.on_done = on_done
        self.units: list[Unit] = []

    def make_units(self, node_id: int, geometry: tuple[str, ...]) -> list[Unit]:
        """The units of a node set to `geometry`, each with its running process.

        Sized by the profile table's `memory_mb` (the packaged YAML's nominal sizes, e.g. 5120 MiB
        for 1g.5gb): no GPU Manager reports a unit here. The live scheduler sizes slices by what
        the managers report (NVML's 4864 MiB), so the two differ by that much (about 5%)."""
        units = []
        for key in geometry:
            u = Unit(len(self.units), node_id, key, float(self.sd.gpu.memory_mb(key)), self.exclusive)
            u.last = self.env.now
            self.units.append(u)
            units.append(u)
            self.env.process(self._loop(u))
        return units

    def run(self, u: Unit, j: Job, node_id: int) -> None:
        """Start batch `j` on unit `u` (of node `node_id`) now."""
        self._advance(u)
        j.remaining, j.node, j.unit, j.start, j.profile = j.work, node_id, u.id, self.env.now, u.profile
        u.jobs.append(j)
        u.used_mb += j.mem_mb
        self._rerate(u)
        self.poke(u)

    def shut(self, u: Unit) -> None:
        """The unit is gone (its node reconfigured or left): its process ends."""
        u.gone = True
        self.poke(u)

    def poke(self, u: Unit) -> None:
        if u.wake is not None and not u.wake.triggered:
            u.wake.succeed()

    def _advance(self, u: Unit) -> None:
        dt = self.env.now - u.last
        if dt > 0:
            for j in u.jobs:
                j.remaining -= j.rate * dt
        u.last = self.env.now

    def _rerate(self, u: Unit) -> None:
        if not u.jobs:
            return
        if u.exclusive:
            for j in u.jobs:
                j.rate = 1.0 / self.sd.rdf(j.model, u.profile)
            return
        sum_d = sum(self.sd.compute_demand(j.model, u.profile) for j in u.jobs)
        sum_f = sum(self.sd.fbr(j.model) for j in u.jobs)
        contention = max(1.0, sum_d, sum_f) * (1.0 + self.corunner_overhead * (len(u.jobs) - 1))
        for j in u.jobs:
            j.rate = 1.0 / (self.sd.rdf(j.model, u.profile) * contention)

    def _loop(self, u: Unit):
        env = self.env
        while True:
            if u.gone:
                return
            u.wake = env.event()
            if not u.jobs:
                yield u.wake
                continue
            dt = max(0.0, min(j.remaining / j.rate for j in u.jobs))
            yield env.timeout(dt) | u.wake
            self._advance(u)
            finished = [j for j in u.jobs if j.remaining <= 1e-9]
            if finished:
                u.jobs = [j for j in u.jobs if j.remaining > 1e-9]
                for j in finished:
                    u.used_mb -= j.mem_mb
                self._rerate(u)
                for j in finished:
                    self.on_done(j)
