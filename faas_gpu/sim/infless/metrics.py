"""What an INFless simulation run counts, per function, and the paper's metrics computed from it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


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
