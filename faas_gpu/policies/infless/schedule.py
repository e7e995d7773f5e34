"""Algorithm 1 of INFless: greedy non-uniform scaling.

For the residual load R of one function, new instances are added one at a time: batch sizes
are tried from the largest; the feasible configurations of that batch size (AvailableConfig:
t_exec <= t_slo/2 and R >= r_low, or t_exec <= t_slo for b = 1) are scored on every server by
the resource efficiency of Eq. 10,

    e_ij = (r_up / (beta*c_i + g_i)) / (1 - (beta*c_i + g_i) / (beta*C_j + G_j)),

(the numerator normalised to [0, 1]); the best pair is placed, R drops by r_up, and the loop
goes on. As R shrinks, large batches stop being feasible (R < r_low), so one function ends up
with instances of different batch sizes and shares.

For a configuration, e_ij is largest on the server with the least free capacity that still
fits it, so servers are kept sorted by free capacity and each configuration costs a bisection,
not a scan of the cluster (the paper's 2,000-server simulation).

With `path` (issue 20) the serving path's CPU is a node resource (`path.path_rate`): on each
server an instance's rate is cut to what the server's cores left after its own pay the path for,
its cost in Eq. 10 counts those cores (c + r * cpu_per_request(b)), and placing it takes them. So
instances beyond a node's CPU add no capacity and are not placed, and a larger batch, which pays
the path's per-batch part over more requests, scores higher. Servers are then scanned (the rate
depends on the server), as a provider's node or few are.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from .capacity import Candidate, batch_timeout_s, bounds, feasible
from .path import PathCost, path_rate

# Xeon Silver 4215 (AVX-512, one FMA unit: 32 fp32 FLOP/cycle at 2.5 GHz) against one 1% of an
# RTX 2080 Ti's 13.45 TFLOPS: the testbed of the paper. An assumption; see beta_from_flops.
DEFAULT_BETA = (2.5e9 * 32) / (13.45e12 / 100)


def beta_from_flops(cpu_core_flops: float, gpu_flops: float) -> float:
    """beta converts one CPU core into GPU-share units (1 unit = 1% of one GPU's SMs)."""
    if cpu_core_flops <= 0 or gpu_flops <= 0:
        raise ValueError("beta: FLOPS must be positive")
    return cpu_core_flops / (gpu_flops / 100.0)


@dataclass
class Server:
    """Free resources of one server: CPU cores, and the free SM share (%) of each GPU."""

    name: str
    cpu_free: float
    gpus_free: list[float] = field(default_factory=list)

    def capacity(self, beta: float) -> float:
        return beta * self.cpu_free + sum(self.gpus_free)

    def gpu_for(self, gpu: float) -> int | None:
        """Best-fit GPU for a share (None for a CPU-only instance or when none fits)."""
        if gpu <= 0:
            return None
        fits = [(free, i) for i, free in enumerate(self.gpus_free) if free >= gpu - 1e-9]
        return min(fits)[1] if fits else -1

    def fits(self, c: Candidate) -> bool:
        return self.cpu_free >= c.cpu - 1e-9 and self.gpu_for(c.gpu) != -1


@dataclass(frozen=True)
class Placement:
    server: str
    gpu_index: int | None
    candidate: Candidate
    r_low: float
    r_up: float
    timeout_s: float


@dataclass
class ScheduleResult:
    placements: list[Placement]
    unplaced_rps: float
    servers: list[Server]


def _cost(c: Candidate, beta: float) -> float:
    return beta * c.cpu + c.gpu


def efficiency(c: Candidate, r_up: float, server_capacity: float, beta: float, best_density: float) -> float:
    """Eq. 10; a configuration that fills the server exactly leaves no fragment and scores highest."""
    w = _cost(c, beta)
    density = (r_up / w) / best_density if best_density > 0 else 0.0
    return density / max(1e-9, 1.0 - w / server_capacity)


class _Cluster:
    """Servers ordered by free capacity, for the smallest-fitting-server lookup."""

    def __init__(self, servers: Iterable[Server], beta: float):
        self.beta = beta
        self.servers = {s.name: replace(s, gpus_free=list(s.gpus_free)) for s in servers}
        self.order = sorted((s.capacity(beta), s.name) for s in self.servers.values())

    def tightest(self, c: Candidate) -> Server | None:
        w = _cost(c, self.beta)
        i = bisect.bisect_left(self.order, (w - 1e-9, ""))
        for _cap, name in self.order[i:]:
            s = self.servers[name]
            if s.fits(c):
                return s
        return None

    def take(self, s: Server, c: Candidate, path_cpu: float = 0.0) -> int | None:
        self.order.remove((s.capacity(self.beta), s.name))
        gi = s.gpu_for(c.gpu)
        s.cpu_free -= c.cpu + path_cpu
        if gi is not None:
            s.gpus_free[gi] -= c.gpu
        bisect.insort(self.order, (s.capacity(self.beta), s.name))
        return gi


def schedule(
    residual_rps: float,
    candidates: Sequence[Candidate],
    servers: Sequence[Server],
    t_slo_s: float,
    *,
    beta: float = DEFAULT_BETA,
    max_instances: int | None = None,
    select: str = "efficiency",
    path: PathCost | None = None,
    max_batch: int | None = None,
    rows_in_flight: int | None = None,
) -> ScheduleResult:
    """Instances (configuration + server) for `residual_rps`; servers are not modified.

    `max_batch`: the largest batch the model itself accepts (issue 43: a program exported with a
    static batch of 1 takes no other; `faas_gpu.models.batch_limits`); no plan's batch exceeds it.

    `rows_in_flight`: the most calls seen in flight at once. An instance serves only the calls
    waiting for it, and a batch fills only from them, so the instances placed together take no
    more rows (their batches) than that, bar a first instance of batch 1: beyond it batches leave
    by their timeouts, part full, and instances idle. Under 32 closed-loop callers a plan of two
    batch-32 instances served 128-160 rps, each batch holding 16 and waiting out its timeout, where
    one of them served 700 (issue 46's load step). Arrivals that outgrow the plan queue, which
    raises the calls in flight and so the next plan's rows.

    `path`: the serving path's CPU, reserved on the servers' cores (see the module's doc); a
    placement's r_up is then the rate the server's CPU lets it serve.

    `select="max-throughput"` is the ablation without resource scheduling (RS): the feasible
    configuration with the highest r_up, on the first server that fits it.
    """
    if select not in ("efficiency", "max-throughput"):
        raise ValueError(f"select: must be 'efficiency' or 'max-throughput', got {select!r}")
    cluster = _Cluster(servers, beta)
    by_batch: dict[int, list[tuple[Candidate, float, float]]] = {}
    best_density = 0.0
    for c in candidates:
        if c.t_exec_s <= 0 or _cost(c, beta) <= 0 or (max_batch is not None and c.batch > max_batch):
            continue
        b = bounds(c.t_exec_s, t_slo_s, c.batch, c.path_s)
        if b.r_up <= 0:
            continue
        by_batch.setdefault(c.batch, []).append((c, b.r_low, b.r_up))
        best_density = max(best_density, b.r_up / _cost(c, beta))
    placements: list[Placement] = []
    rps = residual_rps
    rows = math.inf if rows_in_flight is None else rows_in_flight
    while rps > 1e-9 and (max_instances is None or len(placements) < max_instances):
        chosen = None
        for batch in sorted(by_batch, reverse=True):
            if batch > rows and (placements or batch > 1):
                continue  # a first instance of batch 1 always: something serves
            options = [(c, lo, up) for c, lo, up in by_batch[batch] if feasible(c, t_slo_s, rps)]
            if not options:
                continue
            if path is None:
                chosen = _choose(options, cluster, beta, best_density, select)
            else:
                chosen = _choose_with_path(options, cluster, beta, best_density, select, path)
            if chosen is not None:
                break
        if chosen is None:
            break  # the cluster cannot fit any feasible configuration
        (c, lo, up), server = chosen
        path_cpu = 0.0
        if path is not None:
            up = path_rate(c, up, server.cpu_free, path)
            lo = min(lo, up)  # the load fills its batches (R >= r_low); the node's CPU caps what it serves
            path_cpu = up * path.cpu_per_request_s(c.batch)
        gi = cluster.take(server, c, path_cpu)
        timeout = batch_timeout_s(c.t_exec_s, t_slo_s, c.batch, c.path_s)
        placements.append(Placement(server.name, gi, c, lo, up, timeout))
        rps -= up
        rows -= c.batch
    return ScheduleResult(placements, max(0.0, rps), list(cluster.servers.values()))


def _choose(options, cluster: _Cluster, beta: float, best_density: float, select: str):
    if select == "max-throughput":
        for option in sorted(options, key=lambda o: (-o[2], _cost(o[0], beta))):
            for _cap, name in cluster.order:
                s = cluster.servers[name]
                if s.fits(option[0]):
                    return option, s
        return None
    best, best_e = None, -math.inf
    for option in options:
        s = cluster.tightest(option[0])
        if s is None:
            continue
        e = efficiency(option[0], option[2], s.capacity(beta), beta, best_density)
        if e > best_e:
            best, best_e = (option, s), e
    return best


def _choose_with_path(options, cluster: _Cluster, beta: float, best_density: float, select: str, path: PathCost):
    """`_choose` with the path's CPU reserved: each (configuration, server) at the rate the
    server's cores let it serve, at least one batch a second. That rate may fall below r_low:
    the load still fills the batches (feasibility asked R >= r_low), the node serves less of it."""
    best, best_key = None, None
    for c, lo, up in options:
        per = path.cpu_per_request_s(c.batch)
        for _cap, name in cluster.order:
            s = cluster.servers[name]
            if not s.fits(c):
                continue
            r = path_rate(c, up, s.cpu_free, path)
            if r < max(c.batch, 1.0):
                continue
            if select == "max-throughput":
                key = (r, -_cost(c, beta))
            else:
                w = beta * (c.cpu + r * per) + c.gpu
                density = (r / w) / best_density if best_density > 0 else 0.0
                key = (density / max(1e-9, 1.0 - w / s.capacity(beta)), 0.0)
            if best_key is None or key > best_key:
                best, best_key = ((c, lo, up), s), key
    return best
