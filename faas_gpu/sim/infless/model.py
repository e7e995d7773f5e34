"""What the INFless simulation is made of: the functions (profiled models with an SLO), the
instances serving them, the cluster's free resources, and the view of it a serving system drives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from faas_gpu.policies.infless import Candidate, Server

from ..infless_data import ProfileRow

BETA = 64.0 / 142.0  # the authors' estimator: 64 GFLOPS per CPU thread, 142 per 1% of a 2080 Ti's SMs
COLD_START_S = 3.0  # assumed: container start + TF-Serving model load; the paper gives no figure
MIN_AGE_S = 10.0  # INFless releases an instance only after it served this long (no flapping)
KEEPALIVE_S = 300.0  # OpenFaaS+ and BATCH (§5.1)
OPENFAAS_CONFIG = (2, 10)  # CPU threads, GPU SM %


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


class Platform(Protocol):
    """The simulated platform as a serving system drives it (`Simulation` is one): it reads the
    functions, their instances and activity and the free resources, and starts and stops instances.
    Written down so that the systems depend on this view, not on the event loop that owns it."""

    beta: float
    functions: dict[str, Function]
    cluster: Cluster
    instances: dict[str, list[Instance]]
    active: dict[str, list[int]]  # the minutes each function was invoked in
    short: dict[str, bool]  # wanted capacity this step and found none placeable

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
    ) -> Instance: ...

    def stop(self, inst: Instance) -> None: ...


class System(Protocol):
    """A serving system (INFless, a baseline or an ablation), stepped once a second by the loop."""

    name: str

    def control(self, fn: Function, rps: float, now: float) -> None:
        """Scale `fn`'s instances for the rate `rps` measured in the last step."""

    def weights(self, fn: Function, warm: list[Instance], lam: float) -> list[float]:
        """How this step's load `lam` is split over the warm instances (relative weights)."""

    def capacity(self, fn: Function, inst: Instance, lam: float) -> float:
        """Requests per second `inst` serves within the SLO at the function's rate `lam`."""
