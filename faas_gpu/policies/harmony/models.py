"""HarmonyBatch's latency models (§III-A, Eq. 1-4) and their coefficients.

CPU functions (Eq. 1): for each batch size b, average and maximum latency fall exponentially with
the vCPU cores c, L = alpha_b * exp(-c / beta_b) + gamma_b.

GPU functions (Eq. 2-4): with the whole GPU (M_max GB) a batch takes L0 = xi1 * b + xi2. cGPU time
slicing gives a function with m GB a slice of m * tau out of every M_max * tau, so the average
latency is (M_max / m) * L0 (Eq. 3) and the worst case waits one preempted stretch of
(M_max - m) * tau per slice it needs (Eq. 4). Two refinements come from the reference's
coefficients file and code, not from the paper's text: the worst case is padded by `max_overhead`
(1.2) when the function does not own the whole GPU, and a model may have a host share
(`host_share`, BERT's pre-processing) that runs on the function's vCPUs (capped at one) rather
than on the GPU.

`ModelCoefficients.from_json` reads the reference's `model.json` entry for one model, handed in as
data: the file is read by `faas_gpu.policy_data.harmony.load_models`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ExpCurve:
    """Eq. 1 for one batch size: alpha * exp(-c / beta) + gamma."""

    alpha: float
    beta: float
    gamma: float

    def __call__(self, vcpu: float) -> float:
        return self.alpha * math.exp(-vcpu / self.beta) + self.gamma

    def vcpu_for(self, latency: float) -> float:
        """Fewest vCPU at which the curve is <= latency (inf when gamma is already above it)."""
        if latency <= self.gamma:
            return math.inf
        if self.alpha <= 0 or latency - self.gamma >= self.alpha:
            return 0.0
        return -self.beta * math.log((latency - self.gamma) / self.alpha)


@dataclass(frozen=True)
class CpuCoefficients:
    """Eq. 1 coefficients per batch size (index b - 1) and the model's memory need (MB = a * b + c)."""

    avg: tuple[ExpCurve, ...]
    max: tuple[ExpCurve, ...]
    mem_mb_per_batch: float = 0.0
    mem_mb_fixed: float = 0.0

    @property
    def max_batch(self) -> int:
        return len(self.avg)

    def latency_avg(self, vcpu: float, batch: int) -> float:
        return self.avg[batch - 1](vcpu)

    def latency_max(self, vcpu: float, batch: int) -> float:
        return self.max[batch - 1](vcpu)

    def memory_mb(self, batch: int) -> float:
        return self.mem_mb_per_batch * batch + self.mem_mb_fixed


@dataclass(frozen=True)
class GpuCoefficients:
    """Eq. 2-4 coefficients (seconds), the GPU's memory M_max (GB) and what a function needs around it."""

    xi1: float
    xi2: float
    tau: float = 0.002
    m_max: int = 24
    gpu_share: float = 1.0
    host_share: float = 0.0
    host_mem_mb: float = 512.0
    batch_per_gb: tuple[int, ...] = ()
    max_overhead: float = 1.2

    def base_latency(self, batch: int) -> float:
        """Eq. 2: L0 on the whole GPU."""
        return self.xi1 * batch + self.xi2

    def memory_need_gb(self, batch: int) -> int:
        """Constraint (8): GPU memory a batch needs. `batch_per_gb[i]` is the largest batch that fits in i + 1 GB."""
        for i, largest in enumerate(self.batch_per_gb):
            if batch <= largest:
                return i + 1
        return len(self.batch_per_gb) + 1

    def _host(self, batch: int, vcpu: float) -> float:
        if not self.host_share:
            return 0.0
        return self.base_latency(batch) * self.host_share / min(vcpu, 1.0)

    def latency_avg(self, gpu_gb: int, batch: int, vcpu: float = 1.0) -> float:
        """Eq. 3: (M_max / m) * L0 (plus the host share on the function's vCPUs)."""
        l0 = self.base_latency(batch) * self.gpu_share
        return self.m_max / gpu_gb * l0 + self._host(batch, vcpu)

    def latency_max(self, gpu_gb: int, batch: int, vcpu: float = 1.0) -> float:
        """Eq. 4: ceil(L0 / (m tau)) * (M_max - m) * tau + L0, padded by max_overhead below a whole GPU."""
        l0 = self.base_latency(batch) * self.gpu_share
        slices = math.ceil(l0 / (gpu_gb * self.tau))
        scale = 1.0 if gpu_gb == self.m_max else self.max_overhead
        return ((self.m_max - gpu_gb) * slices * self.tau + l0) * scale + self._host(batch, vcpu)


@dataclass(frozen=True)
class ModelCoefficients:
    """One DNN model's CPU and GPU latency models.

    `deterministic` is BATCH's view of latency [8]: the maximum is taken to be the average.
    """

    name: str
    cpu: CpuCoefficients
    gpu: GpuCoefficients
    deterministic: bool = False

    def cpu_latency_avg(self, vcpu: float, batch: int) -> float:
        return self.cpu.latency_avg(vcpu, batch)

    def cpu_latency_max(self, vcpu: float, batch: int) -> float:
        if self.deterministic:
            return self.cpu.latency_avg(vcpu, batch)
        return self.cpu.latency_max(vcpu, batch)

    def gpu_latency_avg(self, gpu_gb: int, batch: int, vcpu: float = 1.0) -> float:
        return self.gpu.latency_avg(gpu_gb, batch, vcpu)

    def gpu_latency_max(self, gpu_gb: int, batch: int, vcpu: float = 1.0) -> float:
        if self.deterministic:
            return self.gpu.latency_avg(gpu_gb, batch, vcpu)
        return self.gpu.latency_max(gpu_gb, batch, vcpu)

    def as_deterministic(self) -> ModelCoefficients:
        return replace(self, deterministic=True)

    @classmethod
    def from_json(cls, name: str, entry: dict, gpu_kind: str = "A10") -> ModelCoefficients:
        """One model's entry of the reference's `model.json` (Exponential fits; GPU block `gpu_kind`)."""
        cpu = entry["CPU"]

        def curves(block: dict, which: str) -> tuple[ExpCurve, ...]:
            rows = block[which]["Exponential"]
            if not rows:
                raise ValueError(f"{name}: no CPU '{which}' Exponential coefficients")
            return tuple(ExpCurve(float(a), float(b), float(g)) for a, b, g in rows)

        mem = cpu.get("mem", [0.0, 0.0])
        gpu = entry["GPU"]
        g = gpu[gpu_kind]
        cpu_c = CpuCoefficients(curves(cpu, "avg"), curves(cpu, "max"), float(mem[0]), float(mem[1]))
        if len(cpu_c.avg) != len(cpu_c.max):
            raise ValueError(f"{name}: CPU avg and max coefficients cover different batch sizes")
        gpu_c = GpuCoefficients(
            xi1=float(g["l1"]),
            xi2=float(g["l2"]),
            tau=float(g.get("t", 0.002)),
            m_max=int(g.get("G", 24)),
            gpu_share=float(g.get("a", 1.0)),
            host_share=float(g.get("b", 0.0)),
            host_mem_mb=float(gpu.get("mem", 512)),
            batch_per_gb=tuple(int(x) for x in gpu.get("gpu_mem", [])),
        )
        if gpu_c.base_latency(1) <= 0:
            raise ValueError(f"{name}: GPU latency xi1 * 1 + xi2 = {gpu_c.base_latency(1)} s is not positive")
        return cls(name, cpu_c, gpu_c)
