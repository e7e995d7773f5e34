"""The baselines of Table 3 as serving systems of the simulation: OpenFaaS+ and BATCH, both with
uniform scaling (one configuration for all instances) and a fixed 300 s keep-alive."""

from __future__ import annotations

import math
from collections import defaultdict, deque

from faas_gpu.policies.infless import FixedKeepAlive

from ..infless_data import ProfileRow
from .model import KEEPALIVE_S, OPENFAAS_CONFIG, Function, Instance, Platform


class _Uniform:
    """Uniform scaling with a fixed keep-alive: ceil(R / per-instance rate) instances of one
    configuration, first-fit; instances needed within the last `keepalive_s` stay."""

    name = "uniform"

    def __init__(self, sim: Platform, keepalive_s: float = KEEPALIVE_S):
        self.sim = sim
        self.keepalive = FixedKeepAlive(keepalive_s)
        self.needs: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self.current: dict[str, tuple] = {}

    def choose(self, fn: Function, rps: float) -> tuple[tuple, float]:
        """(configuration tag, per-instance rate); the tag is (batch, cpu, gpu)."""
        raise NotImplementedError

    def control(self, fn: Function, rps: float, now: float) -> None:
        tag, rate = self.choose(fn, rps)
        need = math.ceil(rps / rate - 1e-9) if rps > 0 and rate > 0 else 0
        hist = self.needs[fn.name]
        hist.append((now, need))
        while hist and hist[0][0] <= now - self.keepalive.keepalive_s:
            hist.popleft()
        target = max(n for _, n in hist)
        insts = self.sim.instances[fn.name]
        mine = [i for i in insts if i.tag == tag]
        batch, cpu, gpu = tag
        self.sim.short[fn.name] = False
        while len(mine) < need:
            spot = self.sim.cluster.first_fit(cpu, gpu)
            if spot is None:
                self.sim.short[fn.name] = True
                break
            t = fn.true_s(cpu, gpu, batch)
            mine.append(
                self.sim.start(
                    fn,
                    batch,
                    cpu,
                    gpu,
                    spot[0],
                    spot[1],
                    now,
                    0.0,
                    math.floor(1.0 / t) * batch,
                    self.timeout(fn, t, batch),
                    tag,
                )
            )
        # surplus beyond the keep-alive target goes, those still starting first
        for inst in sorted(mine, key=lambda i: (-i.ready_s, -i.id))[: max(0, len(mine) - target)]:
            self.sim.stop(inst)
        # a reconfiguration retires the old configuration once the new one is warm
        warm_mine = sum(1 for i in self.sim.instances[fn.name] if i.tag == tag and i.ready_s <= now)
        if warm_mine >= need:
            for inst in [i for i in self.sim.instances[fn.name] if i.tag != tag]:
                self.sim.stop(inst)

    def timeout(self, fn: Function, t: float, batch: int) -> float:
        return 0.0

    def weights(self, fn: Function, warm: list[Instance], lam: float) -> list[float]:
        return [self.capacity(fn, i, lam) for i in warm]

    def capacity(self, fn: Function, inst: Instance, lam: float) -> float:
        return 1.0 / inst.t_s


class OpenFaaSPlus(_Uniform):
    name = "OpenFaaS+"

    def choose(self, fn: Function, rps: float) -> tuple[tuple, float]:
        cpu, gpu = OPENFAAS_CONFIG
        t = fn.true_s(cpu, gpu, 1)
        return (1, float(cpu), float(gpu)), float(math.floor(1.0 / t))


class Batch(_Uniform):
    name = "BATCH"
    SWITCH = 0.9  # a new configuration must be at least 10% cheaper per request

    def __init__(self, sim: Platform, keepalive_s: float = KEEPALIVE_S):
        super().__init__(sim, keepalive_s)
        self.rows = {
            f.name: [r for r in f.rows if r.feasible and r.gpu > 0 and r.batch <= 32 and r.ms / 1000.0 <= f.slo_s]
            for f in sim.functions.values()
        }

    @staticmethod
    def per_batch(fn: Function, t: float, batch: int, rps: float) -> float:
        """Requests per batch from the OTP buffer: full, or what arrives before the timeout SLO - t."""
        return 1.0 if batch == 1 else min(float(batch), 1.0 + rps * max(0.0, fn.slo_s - t))

    def cost(self, fn: Function, r: ProfileRow, rps: float) -> float:
        t = r.ms / 1000.0
        return (self.sim.beta * r.cpu + r.gpu) * t / self.per_batch(fn, t, r.batch, rps)

    def choose(self, fn: Function, rps: float) -> tuple[tuple, float]:
        rows = self.rows[fn.name]
        if not rows:
            raise ValueError(f"BATCH: no GPU configuration of {fn.name} meets {fn.slo_s * 1000:g} ms")
        best = min(rows, key=lambda r: (self.cost(fn, r, rps), -r.batch))
        cur = self.current.get(fn.name)
        if cur is not None and (rps <= 0 or self.cost(fn, cur, rps) * self.SWITCH <= self.cost(fn, best, rps)):
            best = cur
        self.current[fn.name] = best
        t = best.ms / 1000.0
        rate = math.floor(1.0 / t) * self.per_batch(fn, t, best.batch, rps)
        return (best.batch, float(best.cpu), float(best.gpu)), rate

    def timeout(self, fn: Function, t: float, batch: int) -> float:
        return 0.0 if batch == 1 else fn.slo_s - t

    def capacity(self, fn: Function, inst: Instance, lam: float) -> float:
        return self.per_batch(fn, inst.t_s, inst.batch, lam) / inst.t_s
