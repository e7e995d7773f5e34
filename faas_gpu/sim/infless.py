"""INFless (ASPLOS '22) against OpenFaaS+ and BATCH (Table 3) on the paper's cluster, in simulation.

A fixed-step fluid model at 1 s steps, not simpy's per-request events: the evaluation needs the
cluster at its limit (tens of thousands of requests per second for the Q&A models) and hour-long
traces, i.e. 10^8 requests, while every policy here acts on *rates* once per control period
(Eq. 1, the dispatcher's three cases, uniform scaling). Within a step requests arrive evenly (a
load generator at a fixed RPS), so an instance with batch b, timeout T and execution time t meets
the SLO exactly when its rate stays under b / t and wait + t <= SLO, which the policies ensure by
construction. What the model counts as SLO violations is therefore what the paper names as their
cause: requests that find no warm capacity and wait a cold start (`cold_start_s`, an assumption:
the paper gives no figure), and load beyond the warm instances' capacity.

Systems (the paper's §5.1 and Table 3); every instance runs at its profiled latency (the truth),
and what a system predicts is its own business:
- INFless: each control period the dispatcher (`dispatch`, alpha = 0.8) sets per-instance rates and
  names the residual, Algorithm 1 (`schedule`) adds instances for it (after reviving idle ones),
  released instances stay idle for LSTH's keep-alive window (the "dynamic keep-alive" of Table 3),
  an idle function is pre-warmed as the provider does; built-in batching with the Eq. 1 timeouts;
  predicted latency = profile x 1.10 (§3.3's offset).
- OpenFaaS+: batch 1, every instance 2 CPU threads + 10% SM (the smallest profiled CPU share;
  the only one profiled at batch 1 for every model), uniform scaling: ceil(R / r_up) instances,
  fixed 300 s keep-alive (instances needed in the last 300 s stay).
- BATCH: OTP batching: one buffer per function fills batches at the function's whole rate R and
  times out at T = SLO - t; one (batch, CPU, GPU) for all instances, the one with the lowest
  cost per request (resources x execution time / requests per batch, pay-per-use as on Lambda)
  among the GPU configurations meeting the SLO at R (an OTP system cannot switch to the CPU, §1);
  a new choice is taken only when it is >= 10% cheaper; uniform scaling, fixed 300 s keep-alive.
- Ablations: INFless with batch sizes {1} (no BB), `select="max-throughput"` (no RS), predicted
  latency x 1.5 / x 2 (OP1.5 / OP2).
Resources are the slots of the authors' scheduler (socket j's 20 threads with GPU j) and are
weighed as the authors' code weighs them, 64 per thread and 142 per 1% SM (`beta` = 64/142), in
Algorithm 1, in BATCH's cost and in the throughput-per-resource metric alike.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from faas_gpu.policies.infless import (
    Candidate,
    FixedKeepAlive,
    InstanceLoad,
    KeepAlivePolicy,
    LongShortTermHistogram,
    Server,
    Windows,
    dispatch,
    schedule,
)
from faas_gpu.policies.infless.keepalive import MINUTE

from .infless_data import ProfileRow, candidates

BETA = 64.0 / 142.0  # the authors' estimator: 64 GFLOPS per CPU thread, 142 per 1% of a 2080 Ti's SMs
COLD_START_S = 3.0  # assumed: container start + TF-Serving model load; the paper gives no figure
MIN_AGE_S = 10.0  # INFless releases an instance only after it served this long (no flapping)
KEEPALIVE_S = 300.0  # OpenFaaS+ and BATCH (§5.1)
OPENFAAS_CONFIG = (2, 10)  # CPU threads, GPU SM %
SYSTEMS = ("INFless", "OpenFaaS+", "BATCH", "INFless-noBB", "INFless-noRS", "INFless-OP1.5", "INFless-OP2")


# §5.1: the OSVT app (object detection, licence recognition, vehicle classification; SLO 200 ms) and
# the Q&A robot (TextCNN-69 and LSTM-2365; DSSM-2389 has no published profile; SLO 50 ms)
SCENARIOS: dict[str, tuple[tuple[str, ...], float]] = {
    "OSVT": (("ssd", "mobilenet", "resnet-50"), 0.200),
    "Q&A": (("textcnn-69", "lstm-maxclass-2365"), 0.050),
}


@dataclass(frozen=True)
class Function:
    name: str
    slo_s: float
    rows: tuple[ProfileRow, ...]

    def true_s(self, cpu: float, gpu: float, batch: int) -> float:
        for r in self.rows:
            if r.cpu == cpu and r.gpu == gpu and r.batch == batch and r.feasible:
                return r.ms / 1000.0
        raise KeyError(f"{self.name}: no feasible profile for cpu={cpu} gpu={gpu} batch={batch}")


@dataclass
class Instance:
    id: int
    fn: str
    batch: int
    cpu: float
    gpu: float
    t_s: float  # true batch latency (the profile)
    r_low: float
    r_up: float
    timeout_s: float
    server: str
    gpu_index: int | None
    created_s: float
    ready_s: float
    tag: tuple = ()
    cost: float = 0.0  # beta * threads + SM %


def scenario_functions(name: str, profiles: dict[str, list[ProfileRow]], slo_s: float | None = None) -> list[Function]:
    models, slo = SCENARIOS[name]
    return [Function(m, slo if slo_s is None else slo_s, tuple(profiles[m])) for m in models]


class Cluster:
    """Free CPU threads and GPU shares per server (a copy of the `Server`s given)."""

    def __init__(self, servers: Sequence[Server]):
        self.servers = {s.name: Server(s.name, s.cpu_free, list(s.gpus_free)) for s in servers}
        self.order = [s.name for s in servers]

    def free(self) -> list[Server]:
        return [Server(s.name, s.cpu_free, list(s.gpus_free)) for s in self.servers.values()]

    def take(self, server: str, gpu_index: int | None, cpu: float, gpu: float) -> None:
        s = self.servers[server]
        s.cpu_free -= cpu
        if gpu_index is not None:
            s.gpus_free[gpu_index] -= gpu
        if s.cpu_free < -1e-9 or (gpu_index is not None and s.gpus_free[gpu_index] < -1e-9):
            raise RuntimeError(f"{server}: over-committed")

    def give(self, inst: Instance) -> None:
        s = self.servers[inst.server]
        s.cpu_free += inst.cpu
        if inst.gpu_index is not None:
            s.gpus_free[inst.gpu_index] += inst.gpu

    def first_fit(self, cpu: float, gpu: float) -> tuple[str, int | None] | None:
        """Where a uniform-scaling platform puts an instance: the first server that fits it."""
        probe = Candidate(1, cpu, gpu, 1.0)
        for name in self.order:
            s = self.servers[name]
            if s.fits(probe):
                return name, s.gpu_for(gpu)
        return None


@dataclass
class FnStats:
    requests: float = 0.0
    good: float = 0.0
    cold: float = 0.0  # requests that found no warm capacity and waited for an instance to start
    overload: float = 0.0  # requests beyond the warm capacity when the cluster had no room for more
    resource_s: float = 0.0  # sum of (beta * threads + SM%) x seconds, warming instances included
    cpu_s: float = 0.0
    gpu_s: float = 0.0
    by_batch: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    configs: set[tuple[int, float, float]] = field(default_factory=set)
    starts: int = 0


@dataclass
class RunResult:
    system: str
    seconds: float
    fns: dict[str, FnStats]

    def total(self, attr: str) -> float:
        return sum(getattr(s, attr) for s in self.fns.values())

    @property
    def throughput_per_resource(self) -> float:
        """Requests served within the SLO per second, per unit of occupied resources (beta*CPU + GPU%)."""
        res = self.total("resource_s")
        return self.total("good") / res if res else 0.0

    def cost_per_request(self, cpu_per_hour: float = 0.034, gpu_per_hour: float = 2.5) -> float:
        """Table 4's prices: $0.034 per CPU (thread) hour, $2.5 per 2080 Ti hour; per request within the SLO."""
        dollars = (self.total("cpu_s") * cpu_per_hour + self.total("gpu_s") / 100.0 * gpu_per_hour) / 3600.0
        good = self.total("good")
        return dollars / good if good else float("inf")

    @property
    def goodput_rps(self) -> float:
        return self.total("good") / self.seconds if self.seconds else 0.0

    @property
    def slo_violation(self) -> float:
        n = self.total("requests")
        return (n - self.total("good")) / n if n else 0.0

    @property
    def cold_rate(self) -> float:
        n = self.total("requests")
        return self.total("cold") / n if n else 0.0

    def batches_used(self, fn: str) -> set[int]:
        return {b for b, n in self.fns[fn].by_batch.items() if n > 0}


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


def make_system(name: str, sim: Simulation, keepalive: KeepAlivePolicy | None = None):
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


class INFlessSystem:
    """Drives the dispatcher, Algorithm 1 and a keep-alive policy; none of them is re-implemented.

    Released instances (the dispatcher's case iii) stop taking load and stay idle, still holding
    their resources, for LSTH's keep-alive window (they are unloaded at once when the window has a
    pre-warm gap): the "dynamic keep-alive" of Table 3, against the baselines' fixed 300 s. A
    scale-up revives idle instances first (batches that still fill: R >= r_low), then calls
    Algorithm 1 for what is left. A function with no instance at all is pre-warmed as the
    provider does (one instance, inside the window after the last active minute).
    """

    def __init__(
        self,
        sim: Simulation,
        name: str = "INFless",
        *,
        offset: float = 1.10,
        batches: set[int] | None = None,
        select: str = "efficiency",
        keepalive: KeepAlivePolicy | None = None,
        alpha: float = 0.8,
    ):
        self.sim, self.name, self.select, self.alpha = sim, name, select, alpha
        self.keepalive = keepalive or LongShortTermHistogram()
        self.cands = {f.name: candidates(f.rows, offset=offset, batches=batches) for f in sim.functions.values()}
        self.rates: dict[str, dict] = {}
        self.idle: dict[int, float] = {}  # instance id -> released at
        self._windows: dict[tuple[str, int], Windows] = {}

    def _window(self, fn: Function, now: float) -> Windows | None:
        minutes = self.sim.active[fn.name]
        if not minutes:
            return None
        key = (fn.name, int(now // MINUTE))
        if key not in self._windows:
            self._windows[key] = self.keepalive.windows(minutes, key[1])
        return self._windows[key]

    def _warm_window(self, fn: Function, w: Windows | None, now: float) -> bool:
        """The provider's rule: inside [prewarm, prewarm + keep-alive] after the last active minute."""
        if w is None:
            return False
        since = now - self.sim.active[fn.name][-1] * MINUTE
        in_window = since <= w.prewarm_s + w.keepalive_s
        return in_window and (w.prewarm_s == 0 or since < MINUTE or since >= w.prewarm_s)

    def _place(self, fn: Function, rps: float, now: float, limit: int | None = None) -> float:
        res = schedule(
            rps,
            self.cands[fn.name],
            self.sim.cluster.free(),
            fn.slo_s,
            beta=self.sim.beta,
            select=self.select,
            max_instances=limit,
        )
        for p in res.placements:
            c = p.candidate
            self.sim.start(fn, c.batch, c.cpu, c.gpu, p.server, p.gpu_index, now, p.r_low, p.r_up, p.timeout_s)
        return res.unplaced_rps

    def control(self, fn: Function, rps: float, now: float) -> None:
        w = self._window(fn, now)
        every = self.sim.instances[fn.name]
        for i in [i for i in every if i.id in self.idle]:
            if w is None or w.prewarm_s > 0 or now - self.idle[i.id] > w.keepalive_s:
                del self.idle[i.id]
                self.sim.stop(i)
        live = [i for i in self.sim.instances[fn.name] if i.id not in self.idle]
        d = dispatch([InstanceLoad(i.id, i.r_low, i.r_up) for i in live], rps, alpha=self.alpha)
        self.sim.short[fn.name] = False
        if d.case == "scale-up":
            residual = d.scale_up_rps
            for i in sorted((i for i in self.sim.instances[fn.name] if i.id in self.idle), key=lambda i: -i.r_up):
                if residual <= 1e-9:
                    break
                if i.batch == 1 or residual >= i.r_low:
                    del self.idle[i.id]
                    residual -= i.r_up
            if residual > 1e-9:
                self.sim.short[fn.name] = self._place(fn, residual, now) > 1e-9
        elif d.case == "release":
            gone = set(d.release)
            for i in live:
                if i.id in gone and now - i.created_s >= MIN_AGE_S:
                    self.idle[i.id] = now
        if rps <= 0 and not self.sim.instances[fn.name] and self._warm_window(fn, w, now):
            self._place(fn, 1e-6, now, limit=1)  # pre-warm before the predicted arrival
        live = [i for i in self.sim.instances[fn.name] if i.id not in self.idle]
        loads = [InstanceLoad(i.id, i.r_low, i.r_up) for i in live]
        self.rates[fn.name] = dispatch(loads, rps, alpha=self.alpha, keep=len(live)).rates

    def weights(self, fn: Function, warm: list[Instance], lam: float) -> list[float]:
        """The dispatcher's rates; with none yet (no load was measured), live instances by r_up, and
        idle ones only when nothing else is warm (the gateway sends requests to any warm replica)."""
        rates = self.rates.get(fn.name, {})
        w = [rates.get(i.id, 0.0) for i in warm]
        if sum(w) > 0:
            return w
        live = [0.0 if i.id in self.idle else i.r_up for i in warm]
        return live if sum(live) > 0 else [i.r_up for i in warm]

    def capacity(self, fn: Function, inst: Instance, lam: float) -> float:
        return inst.batch / inst.t_s


class _Uniform:
    """Uniform scaling with a fixed keep-alive: ceil(R / per-instance rate) instances of one
    configuration, first-fit; instances needed within the last `keepalive_s` stay."""

    name = "uniform"

    def __init__(self, sim: Simulation, keepalive_s: float = KEEPALIVE_S):
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

    def __init__(self, sim: Simulation, keepalive_s: float = KEEPALIVE_S):
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


# -- experiments ----------------------------------------------------------------------------------


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


@dataclass
class StressPoint:
    rps_per_fn: float
    result: RunResult

    @property
    def total_rps(self) -> float:
        return self.rps_per_fn * len(self.result.fns)


def max_sustained(
    functions: Sequence[Function],
    servers: Sequence[Server],
    system: str,
    *,
    warmup_s: int = 20,
    measure_s: int = 20,
    tolerance: float = 0.01,
    **kw,
) -> StressPoint:
    """The largest constant load (the same RPS for every function) served with no SLO violation
    once warm (stress testing, Fig. 11), found by doubling then bisection to `tolerance`."""

    def run(rps: float) -> RunResult:
        loads = {f.name: [rps] * (warmup_s + measure_s) for f in functions}
        return simulate(functions, loads, servers, system, measure_from=warmup_s, **kw)

    def ok(r: RunResult) -> bool:
        return r.total("requests") - r.total("good") <= 1e-6 * r.total("requests")

    lo, lo_res, hi = 0.0, None, 8.0
    while True:
        res = run(hi)
        if not ok(res):
            break
        lo, lo_res, hi = hi, res, hi * 2
        if hi > 1e7:
            raise RuntimeError(f"{system}: no saturation below 1e7 RPS")
    while hi - lo > tolerance * max(lo, 1.0):
        mid = (lo + hi) / 2
        res = run(mid)
        if ok(res):
            lo, lo_res = mid, res
        else:
            hi = mid
    if lo_res is None:
        lo_res = run(lo) if lo > 0 else run(hi)
    return StressPoint(lo, lo_res)


def pattern_loads(means: Sequence[float], peak_rps: float, hold_s: int = 10, points: int | None = None) -> list[float]:
    """A pattern's 10-minute means scaled so that its peak is `peak_rps`, each held `hold_s` seconds
    (as the authors' load generator replays them: 300 RPS peak, 10 s per point)."""
    pts = list(means[:points] if points else means)
    top = max(pts) if pts else 0.0
    scale = peak_rps / top if top > 0 else 0.0
    return [m * scale for m in pts for _ in range(hold_s)]


# -- keep-alive replay (Fig. 16) --------------------------------------------------------------------


@dataclass
class KeepAliveStats:
    invocations: int
    active_minutes: int
    cold_starts: int
    wasted_minutes: float  # minutes an instance was loaded but idle

    @property
    def cold_rate(self) -> float:
        return self.cold_starts / self.invocations if self.invocations else 0.0


def replay_keepalive(counts: Sequence[int], policy: KeepAlivePolicy) -> KeepAliveStats:
    """Minute-granularity replay (the Azure study's method). After active minute t the policy's
    windows (p, k) say the instance is loaded over [t + p, t + p + k] (from t itself when p = 0);
    the next active minute n is a cold start outside that span, and the loaded time between the end
    of minute t and the start of minute n (or the span's end) is idle waste."""
    minutes = [m for m, c in enumerate(counts) if c > 0]
    cold = 1 if minutes else 0
    waste = 0.0
    for k, t in enumerate(minutes):
        w = policy.windows(minutes, t)  # the policies read only the minutes up to t
        a = t + w.prewarm_s / MINUTE
        b = a + w.keepalive_s / MINUTE
        nxt = minutes[k + 1] if k + 1 < len(minutes) else None
        if nxt is None:
            waste += max(0.0, b - max(a, t + 1))
            continue
        if not a <= nxt <= b:
            cold += 1
        waste += max(0.0, min(b, nxt) - max(a, t + 1))
    return KeepAliveStats(int(sum(counts)), len(minutes), cold, waste)


# -- scheduling cost (Fig. 17) ----------------------------------------------------------------------


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
