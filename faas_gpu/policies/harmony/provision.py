"""funcProvision (§IV-B): the cheapest CPU or GPU function for one group of apps.

A group is its apps' SLOs and rates. Every app's batching timeout is its SLO minus the function's
maximum latency (Constraint 10, taken greedily); the group's equivalent timeout T comes from Eq. 5,
and a batch of b fills when b <= floor(r T) + 1 (Constraint 9).

- CPU, Theorem 1: for a batch size b the per-request cost (Eq. 13) has at most one relative
  minimum c0 in vCPU, the root of Eq. 14 found by bisection; the cheapest size is c0 (its grid
  neighbours), or a bound of the feasible range, whose lower end is found by binary search.
- GPU, Theorem 2: for a GPU memory m the cost falls as b grows (Eq. 16), so b is the largest
  size meeting Constraint 9, found by binary search over 1..B_max; then every m is tried.

Costs are the full price list's (`Prices`), the comparison inside Theorem 1 uses the theorem's
own objective (Eq. 13: vCPU time and invocations), as the paper states it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .cost import TIMEOUT_FORMULAS, Prices, equivalent_timeout, expected_batch
from .models import ModelCoefficients
from .platform import Platform

KINDS = ("cpu", "gpu")


class InfeasibleSLOError(ValueError):
    """No configuration meets an app's SLO; `best_latency_s` is the lowest maximum latency on offer."""

    def __init__(self, app: str, slo_s: float, best_latency_s: float, where: str) -> None:
        self.app = app
        self.slo_s = slo_s
        self.best_latency_s = best_latency_s
        self.where = where
        super().__init__(
            f"app {app!r}: SLO {slo_s * 1000:.0f} ms cannot be met; the best maximum latency is "
            f"{best_latency_s * 1000:.1f} ms ({where})"
        )


@dataclass(frozen=True)
class Provision:
    """A function for a group: kind, size, batch, per-app timeouts (in the group's order) and cost."""

    kind: str
    vcpu: float
    memory_gb: float
    gpu_gb: int
    batch: int
    expected_batch: int
    timeouts: tuple[float, ...]
    group_timeout: float
    latency_avg_s: float
    latency_max_s: float
    cost_per_request: float


@dataclass(frozen=True)
class Load:
    """The SLOs (s) and rates (req/s) of a group's apps."""

    slos: tuple[float, ...]
    rates: tuple[float, ...]
    rate: float = field(init=False)
    slo: float = field(init=False)

    def __post_init__(self) -> None:
        if len(self.slos) != len(self.rates) or not self.slos:
            raise ValueError("Load: one rate per SLO, at least one app")
        object.__setattr__(self, "rate", sum(self.rates))
        object.__setattr__(self, "slo", min(self.slos))


class Provisioner:
    """funcProvision for one model, price list and platform; keeps what does not depend on the load."""

    def __init__(
        self,
        model: ModelCoefficients,
        prices: Prices,
        platform: Platform | None = None,
        timeout_formula: str = "eq5",
    ) -> None:
        if timeout_formula not in TIMEOUT_FORMULAS:
            raise ValueError(f"timeout_formula must be one of {TIMEOUT_FORMULAS}, not {timeout_formula!r}")
        self.model = model
        self.prices = prices
        self.platform = platform or Platform()
        self.timeout_formula = timeout_formula
        self._c0: dict[int, float | None] = {}
        self._knee: dict[tuple[float, float, float, float], float] = {}
        self.gpu_shapes = self._make_gpu_shapes()
        n_b = self.platform.gpu_batch_max + 1
        self._gpu_lmax: list[list[float | None]] = [[None] * n_b for _ in self.gpu_shapes]
        self._gpu_inv: list[list[float | None]] = [[None] * n_b for _ in self.gpu_shapes]

    # -- shared pieces -------------------------------------------------------------------------

    def group_timeout(self, load: Load, latency_max: float, base: float | None = None) -> float:
        """T of Eq. 5 with every app's timeout at SLO - latency_max.

        Eq. 5 commutes with shifting every timeout by the same amount, so T = T(SLOs) - latency_max;
        `base` is T(SLOs), computed once per group.
        """
        if len(load.slos) == 1:
            return load.slos[0] - latency_max
        if self.timeout_formula == "eq5":
            if base is None:
                base = equivalent_timeout(load.slos, load.rates)
            return base - latency_max
        return equivalent_timeout([s - latency_max for s in load.slos], load.rates, "reference")

    def _base(self, load: Load) -> float | None:
        if self.timeout_formula == "eq5" and len(load.slos) > 1:
            return equivalent_timeout(load.slos, load.rates)
        return None

    def _fills(self, load: Load, batch: int, latency_max: float, base: float | None) -> bool:
        """Constraints (10) for the tightest app and (9) for the batch."""
        if latency_max > load.slo:
            return False
        if batch == 1:
            return True
        return batch - 1 <= load.rate * self.group_timeout(load, latency_max, base)

    def priced(self, kind: str, load: Load, vcpu: float, mem: float, gpu: int, batch: int) -> Provision:
        m = self.model
        lmax = m.cpu_latency_max(vcpu, batch) if kind == "cpu" else m.gpu_latency_max(gpu, batch, vcpu)
        if batch == 1:
            timeouts = tuple(0.0 for _ in load.slos)
            t_group = 0.0
        else:
            timeouts = tuple(s - lmax for s in load.slos)
            t_group = self.group_timeout(load, lmax)
        b_eff = expected_batch(batch, load.rate, t_group)
        lavg = m.cpu_latency_avg(vcpu, b_eff) if kind == "cpu" else m.gpu_latency_avg(gpu, b_eff, vcpu)
        cost = self.prices.invocation_cost(lavg, vcpu, mem, gpu) / b_eff
        return Provision(kind, vcpu, mem, gpu, batch, b_eff, timeouts, t_group, lavg, lmax, cost)

    # -- CPU: Theorem 1 ------------------------------------------------------------------------

    def cost_root(self, batch: int) -> float | None:
        """c0 of Theorem 1: the root of Eq. 14 past the curve's bend (None when Eq. 13 only grows)."""
        if batch not in self._c0:
            self._c0[batch] = _eq14_root(self.model.cpu.avg[batch - 1])
        return self._c0[batch]

    def eq13(self, vcpu: float, batch: int) -> float:
        """Eq. 13: a CPU request's cost counting vCPU time and invocations, as Theorem 1 minimises it."""
        return (self.model.cpu_latency_avg(vcpu, batch) * vcpu * self.prices.vcpu_s + self.prices.invocation) / batch

    def cpu_batches(self) -> range:
        return range(1, min(self.platform.cpu_batch_max, self.model.cpu.max_batch) + 1)

    def cpu_for_batch(self, load: Load, batch: int, base: float | None = None) -> float | None:
        """Theorem 1 for one batch size: the vCPU size, or None when no size meets the constraints."""
        grid = self.platform.vcpu_grid
        m = self.model
        lo = self.platform.vcpu_index_at_least(self.platform.min_vcpu_for(m.cpu.memory_mb(batch)))
        hi = len(grid) - 1
        if lo > hi or not self._fills(load, batch, m.cpu_latency_max(grid[hi], batch), base):
            return None
        # binary search: the smallest size meeting the SLO and filling the batch (latency falls with c)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._fills(load, batch, m.cpu_latency_max(grid[mid], batch), base):
                hi = mid
            else:
                lo = mid + 1
        candidates = {lo, len(grid) - 1}
        c0 = self.cost_root(batch)
        if c0 is not None:
            k = int(math.floor((c0 - self.platform.vcpu_min) / self.platform.vcpu_step + 1e-9))
            candidates.update(i for i in (k, k + 1) if lo <= i < len(grid))
        best = min(sorted(candidates), key=lambda i: self.eq13(grid[i], batch))
        return grid[best]

    def cpu(self, load: Load) -> Provision | None:
        best: Provision | None = None
        base = self._base(load)
        for b in self.cpu_batches():
            c = self.cpu_for_batch(load, b, base)
            if c is None:
                continue
            mem = self.platform.cpu_memory_gb(c, self.model.cpu.memory_mb(b))
            if mem is None:
                continue
            p = self.priced("cpu", load, c, mem, 0, b)
            if best is None or p.cost_per_request < best.cost_per_request:
                best = p
        return best

    # -- GPU: Theorem 2 ------------------------------------------------------------------------

    def _make_gpu_shapes(self) -> list[tuple[int, float, float, int]]:
        """(m, vCPU, memory GB, largest batch that fits in m GB) for every usable GPU size."""
        g = self.model.gpu
        shapes = []
        for gb in range(self.platform.gpu_min_gb, min(self.platform.gpu_max_gb, g.m_max) + 1):
            shape = self.platform.gpu_function(gb, g.host_mem_mb)
            if shape is None:
                continue
            b_mem = 0
            for b in range(1, self.platform.gpu_batch_max + 1):
                if g.memory_need_gb(b) > gb:
                    break
                b_mem = b
            if b_mem:
                shapes.append((gb, shape[0], shape[1], b_mem))
        return shapes

    def gpu_latency_max(self, shape: int, batch: int) -> float:
        """Eq. 4 for a GPU shape (index into `gpu_shapes`), memoised: it does not depend on the load."""
        row = self._gpu_lmax[shape]
        v = row[batch]
        if v is None:
            gb, vcpu, _, _ = self.gpu_shapes[shape]
            v = row[batch] = self.model.gpu_latency_max(gb, batch, vcpu)
        return v

    def gpu_batch_for(self, load: Load, shape: int, base: float | None = None) -> int | None:
        """Theorem 2 for one GPU size: the largest batch meeting Constraints (9) and (10), by binary search."""
        if not self._fills(load, 1, self.gpu_latency_max(shape, 1), base):
            return None
        lo, hi = 1, self.gpu_shapes[shape][3]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fills(load, mid, self.gpu_latency_max(shape, mid), base):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _gpu_invocation(self, shape: int, batch: int) -> float:
        row = self._gpu_inv[shape]
        v = row[batch]
        if v is None:
            gb, vcpu, mem, _ = self.gpu_shapes[shape]
            v = row[batch] = self.prices.invocation_cost(self.model.gpu_latency_avg(gb, batch, vcpu), vcpu, mem, gb)
        return v

    def gpu(self, load: Load) -> Provision | None:
        best: tuple[float, int, int] | None = None
        base = self._base(load)
        for k in range(len(self.gpu_shapes)):
            b = self.gpu_batch_for(load, k, base)
            if b is None:
                continue
            cost = self._gpu_invocation(k, b) / b  # a batch meeting Constraint (9) fills: b_eff = b
            if best is None or cost < best[0]:
                best = (cost, k, b)
        if best is None:
            return None
        gb, vcpu, mem, _ = self.gpu_shapes[best[1]]
        return self.priced("gpu", load, vcpu, mem, gb, best[2])

    # -- both ----------------------------------------------------------------------------------

    def best(self, load: Load, kinds: Sequence[str] = KINDS) -> Provision | None:
        """The cheaper of the two; a GPU function must be strictly cheaper to displace a CPU one."""
        cpu = self.cpu(load) if "cpu" in kinds else None
        gpu = self.gpu(load) if "gpu" in kinds else None
        if cpu is None or (gpu is not None and gpu.cost_per_request < cpu.cost_per_request):
            return gpu
        return cpu

    def best_latency(self, kinds: Sequence[str] = KINDS) -> tuple[float, str]:
        """The lowest maximum latency any single request can get, and where."""
        options = []
        if "cpu" in kinds:
            c = self.platform.vcpu_grid[-1]
            options.append((self.model.cpu_latency_max(c, 1), f"CPU function, {c:g} vCPU, batch 1"))
        if "gpu" in kinds and self.gpu_shapes:
            gb, vcpu, _, _ = self.gpu_shapes[-1]
            options.append((self.model.gpu_latency_max(gb, 1, vcpu), f"GPU function, {gb} GB, batch 1"))
        return min(options)

    def knee_rate(self, slo: float, low: float = 0.01, high: float = 40.0, tol: float = 1e-3) -> float:
        """r* of Fig. 7: the rate above which one app with this SLO is cheaper on a GPU function.

        Bisection on the rate; `high` when the app stays on CPU up to it, `low` when it never is.
        """
        key = (slo, low, high, tol)
        if key not in self._knee:
            lo, hi = low, high
            while hi - lo > tol:
                mid = (lo + hi) / 2
                if self.past_knee(slo, mid):
                    hi = mid
                else:
                    lo = mid
            self._knee[key] = hi
        return self._knee[key]

    def past_knee(self, slo: float, rate: float) -> bool:
        """rate > r*(slo): would one app with this SLO and rate be put on a GPU function?

        With the single knee of Fig. 7 this is the threshold test of Alg. 1 (line 9); asking it at
        the rate in hand costs one funcProvision instead of a bisection over rates.
        """
        p = self.best(Load((slo,), (rate,)))
        return p is not None and p.kind == "gpu"


def _eq14_root(curve) -> float | None:
    """The root of alpha (1 - c / beta) exp(-c / beta) + gamma past c = 2 beta, by bisection."""
    a, b, g = curve.alpha, curve.beta, curve.gamma
    if a <= 0 or b <= 0 or g <= 0:
        return None  # Eq. 13 then only rises (a <= 0) or keeps falling (g <= 0): a bound is the minimum

    def d(c: float) -> float:
        return a * (1 - c / b) * math.exp(-c / b) + g

    lo = 2 * b  # Eq. 14 is smallest here; below it Eq. 13 rises, then falls to c0
    if d(lo) >= 0:
        return None
    hi = lo + b
    while d(hi) < 0:
        hi += b
    for _ in range(100):
        mid = (lo + hi) / 2
        if d(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2
