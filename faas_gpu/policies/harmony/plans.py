"""What the planner hands out: apps in, groups of apps with their functions out.

A `Plan` is JSON-able (`to_dict`) so the provider can store it and apply it: for each group, one
function (CPU with `vcpu`, or GPU with `gpu_gb`), its batch size, and the batching timeout of
every app in the group. Under MBS+ one app's requests may be split over several groups; a group
then holds a share of the app (same name, part of its rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .provision import Provision


@dataclass(frozen=True)
class App:
    """An inference application: its SLO (seconds) and request rate (req/s)."""

    name: str
    slo: float
    rate: float

    def __post_init__(self) -> None:
        if not self.slo > 0:
            raise ValueError(f"app {self.name!r}: SLO must be > 0 s, got {self.slo}")
        if not self.rate >= 0:
            raise ValueError(f"app {self.name!r}: rate must be >= 0 req/s, got {self.rate}")


@dataclass(frozen=True)
class Group:
    """Apps batched together on one function, with the function's configuration and predicted cost."""

    apps: tuple[App, ...]
    provision: Provision

    @property
    def rate(self) -> float:
        return sum(a.rate for a in self.apps)

    @property
    def slo(self) -> float:
        return min(a.slo for a in self.apps)

    @property
    def kind(self) -> str:
        return self.provision.kind

    @property
    def batch(self) -> int:
        return self.provision.batch

    @property
    def timeouts(self) -> dict[str, float]:
        """Batching timeout per app (s); 0 with a batch of one."""
        return {a.name: t for a, t in zip(self.apps, self.provision.timeouts, strict=True)}

    @property
    def cost_per_request(self) -> float:
        return self.provision.cost_per_request

    @property
    def cost_per_second(self) -> float:
        return self.provision.cost_per_request * self.rate

    def label(self) -> str:
        """The paper's notation: (vCPU, batch, [timeouts])c or (GPU GB, batch, [timeouts])g."""
        p = self.provision
        size = f"{p.vcpu:.2f}" if p.kind == "cpu" else f"{p.gpu_gb}"
        touts = ", ".join(f"{t:.3f}" for t in p.timeouts) if p.batch > 1 else "0"
        return f"({size}, {p.batch}, [{touts}]){p.kind[0]}"

    def to_dict(self) -> dict:
        p = self.provision
        return {
            "apps": [{"name": a.name, "slo_s": a.slo, "rate_rps": a.rate} for a in self.apps],
            "instance": p.kind,
            "vcpu": round(p.vcpu, 4),
            "memory_gb": round(p.memory_gb, 4),
            "gpu_memory_gb": p.gpu_gb,
            "batch": p.batch,
            "expected_batch": p.expected_batch,
            "timeouts_s": [round(t, 6) for t in p.timeouts],
            "group_timeout_s": round(p.group_timeout, 6),
            "latency_avg_s": round(p.latency_avg_s, 6),
            "latency_max_s": round(p.latency_max_s, 6),
            "cost_per_request": p.cost_per_request,
            "cost_per_second": self.cost_per_second,
        }


@dataclass(frozen=True)
class Plan:
    """Groups for a set of apps; `cost_per_request` is Eq. 7, the rate-weighted mean over groups."""

    strategy: str
    groups: tuple[Group, ...]

    @property
    def rate(self) -> float:
        return sum(g.rate for g in self.groups)

    @property
    def cost_per_second(self) -> float:
        return sum(g.cost_per_second for g in self.groups)

    @property
    def cost_per_request(self) -> float:
        r = self.rate
        return self.cost_per_second / r if r > 0 else 0.0

    def groups_of(self, app: str) -> list[Group]:
        return [g for g in self.groups if any(a.name == app for a in g.apps)]

    def describe(self) -> str:
        return " ; ".join(f"{g.label()} {'+'.join(a.name for a in g.apps)}" for g in self.groups)

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "cost_per_request": self.cost_per_request,
            "cost_per_second": self.cost_per_second,
            "rate_rps": self.rate,
            "groups": [g.to_dict() for g in self.groups],
        }


def sort_by_slo(apps: Sequence[App]) -> list[App]:
    """Alg. 1's list order (line 3); names break ties so that the input's order never matters."""
    return sorted(apps, key=lambda a: (a.slo, a.name))
