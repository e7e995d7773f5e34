"""The INFless simulation's loop: a fixed-step fluid model at 1 s steps, not simpy's per-request events.

The evaluation needs the cluster at its limit (tens of thousands of requests per second for the
Q&A models) and hour-long traces, i.e. 10^8 requests, while every policy here acts on *rates* once
per control period (Eq. 1, the dispatcher's three cases, uniform scaling). Within a step requests
arrive evenly (a load generator at a fixed RPS), so an instance with batch b, timeout T and
execution time t meets the SLO exactly when its rate stays under b / t and wait + t <= SLO, which
the policies ensure by construction. What the model counts as SLO violations is therefore what
the paper names as their cause: requests that find no warm capacity and wait a cold start
(`cold_start_s`, an assumption: the paper gives no figure), and load beyond the warm instances'
capacity. Each step the system in charge (`make_system`) scales, then the step's load is served.
"""

from __future__ import annotations

from collections.abc import Sequence

from faas_gpu.policies.infless import KeepAlivePolicy, Server
from faas_gpu.policies.infless.keepalive import MINUTE

from .baselines import Batch, OpenFaaSPlus
from .infless_system import INFlessSystem
from .metrics import FnStats, RunResult
from .model import BETA, COLD_START_S, Cluster, Function, Instance, Platform, System

SYSTEMS = ("INFless", "OpenFaaS+", "BATCH", "INFless-noBB", "INFless-noRS", "INFless-OP1.5", "INFless-OP2")


class Simulation:
    """Drives one system over per-second loads; `loads[fn][t]` is function fn's RPS in step t."""

    def __init__(
        self,
        functions: Sequence[Function],
        loads: dict[str, Sequence[float]],
        servers: Sequence[Server],
        system: str = "INFless",
        *,
        cold_start_s: float = COLD_START_S,
        keepalive: KeepAlivePolicy | None = None,
        beta: float = BETA,
    ):
        self.beta = beta
        self.functions = {f.name: f for f in functions}
        self.loads = loads
        self.cluster = Cluster(servers)
        self.cold_start_s = cold_start_s
        self.instances: dict[str, list[Instance]] = {f.name: [] for f in functions}
        self.active: dict[str, list[int]] = {f.name: [] for f in functions}  # active minutes
        self._next_id = 0
        self.stats: dict[str, FnStats] = {f.name: FnStats() for f in functions}
        self.short: dict[str, bool] = dict.fromkeys(self.functions, False)  # wanted capacity, none placeable
        self.system = make_system(system, self, keepalive)

    # -- instance life cycle -----------------------------------------------------------------
    def start(
        self,
        fn: Function,
        batch: int,
        cpu: float,
        gpu: float,
        server: str,
        gpu_index: int | None,
        now: float,
        r_low: float,
        r_up: float,
        timeout_s: float,
        tag: tuple = (),
    ) -> Instance:
        self.cluster.take(server, gpu_index, cpu, gpu)
        self._next_id += 1
        inst = Instance(
            self._next_id,
            fn.name,
            batch,
            cpu,
            gpu,
            fn.true_s(cpu, gpu, batch),
            r_low,
            r_up,
            timeout_s,
            server,
            gpu_index,
            now,
            now + self.cold_start_s,
            tag,
            self.beta * cpu + gpu,
        )
        self.instances[fn.name].append(inst)
        self.stats[fn.name].starts += 1
        return inst

    def stop(self, inst: Instance) -> None:
        self.instances[inst.fn].remove(inst)
        self.cluster.give(inst)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, steps: int | None = None, measure_from: int = 0) -> RunResult:
        steps = steps if steps is not None else min(len(v) for v in self.loads.values())
        measured = dict.fromkeys(self.functions, 0.0)
        for t in range(steps):
            now = float(t)
            for name, fn in self.functions.items():
                self.system.control(fn, measured[name], now)
            for name, fn in self.functions.items():
                lam = float(self.loads[name][t])
                measured[name] = lam
                if lam > 0 and (not self.active[name] or self.active[name][-1] != int(now // MINUTE)):
                    self.active[name].append(int(now // MINUTE))
                if t >= measure_from:
                    self._serve(fn, lam, now)
        return RunResult(self.system.name, float(steps - measure_from), self.stats)

    def _serve(self, fn: Function, lam: float, now: float) -> None:
        st = self.stats[fn.name]
        insts = self.instances[fn.name]
        for i in insts:
            st.resource_s += i.cost
            st.cpu_s += i.cpu
            st.gpu_s += i.gpu
        if lam <= 0:
            return
        st.requests += lam
        warm = [i for i in insts if i.ready_s <= now]
        starting = len(warm) < len(insts)
        if not warm:
            st.cold += lam  # nothing warm: every request waits for an instance to start
            return
        weights = self.system.weights(fn, warm, lam)
        total = sum(weights)
        if total <= 0:
            weights, total = [1.0] * len(warm), float(len(warm))
        for inst, w in zip(warm, weights, strict=True):
            load = lam * w / total
            if load <= 0:
                continue
            served = min(load, self.system.capacity(fn, inst, lam))
            st.good += served
            st.by_batch[inst.batch] += served
            st.configs.add((inst.batch, inst.cpu, inst.gpu))
            if load > served:
                if self.short[fn.name] and not starting:
                    st.overload += load - served
                else:
                    st.cold += load - served  # waits for an instance being (or about to be) started


def make_system(name: str, sim: Platform, keepalive: KeepAlivePolicy | None = None) -> System:
    if name == "INFless":
        return INFlessSystem(sim, name, keepalive=keepalive)
    if name == "INFless-noBB":
        return INFlessSystem(sim, name, batches={1}, keepalive=keepalive)
    if name == "INFless-noRS":
        return INFlessSystem(sim, name, select="max-throughput", keepalive=keepalive)
    if name == "INFless-OP1.5":
        return INFlessSystem(sim, name, offset=1.5, keepalive=keepalive)
    if name == "INFless-OP2":
        return INFlessSystem(sim, name, offset=2.0, keepalive=keepalive)
    if name == "OpenFaaS+":
        return OpenFaaSPlus(sim)
    if name == "BATCH":
        return Batch(sim)
    raise ValueError(f"system: one of {SYSTEMS}, got {name!r}")


def simulate(
    functions: Sequence[Function],
    loads: dict[str, Sequence[float]],
    servers: Sequence[Server],
    system: str,
    *,
    measure_from: int = 0,
    **kw,
) -> RunResult:
    return Simulation(functions, loads, servers, system, **kw).run(measure_from=measure_from)
