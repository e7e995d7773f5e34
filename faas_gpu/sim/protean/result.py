"""What a PROTEAN simulation run reports: batch latencies by class, SLO attainment, the
reconfigurations and cold starts, and (with spot procurement) the cost."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RunResult:
    scheme: str
    workload: str
    strict_latency_s: np.ndarray
    strict_slo_s: float
    be_latency_s: np.ndarray
    reconfigurations: int
    cold_starts: int
    makespan_s: float
    cost: dict[str, float] = field(default_factory=dict)
    geometry_time: dict[tuple[str, ...], float] = field(default_factory=dict)

    @property
    def strict_slo_pct(self) -> float:
        n = len(self.strict_latency_s)
        return 100.0 * float((self.strict_latency_s <= self.strict_slo_s + 1e-9).sum()) / n if n else math.nan

    def pct(self, values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) * 1000.0 if len(values) else math.nan

    def summary(self) -> dict[str, float | int | str]:
        return {
            "scheme": self.scheme,
            "workload": self.workload,
            "strict_batches": len(self.strict_latency_s),
            "strict_slo_pct": self.strict_slo_pct,
            "strict_p50_ms": self.pct(self.strict_latency_s, 50),
            "strict_p99_ms": self.pct(self.strict_latency_s, 99),
            "slo_ms": self.strict_slo_s * 1000.0,
            "be_batches": len(self.be_latency_s),
            "be_p50_ms": self.pct(self.be_latency_s, 50),
            "be_p99_ms": self.pct(self.be_latency_s, 99),
            "reconfigurations": self.reconfigurations,
            "cold_starts": self.cold_starts,
            **{f"cost_{k}": v for k, v in self.cost.items()},
        }
