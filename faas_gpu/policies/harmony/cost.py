"""HarmonyBatch's cost model (Eq. 6) and the equivalent batching timeout of a group (Eq. 5).

Eq. 6 prices one request of a group as [L_avg * (c * K1 + m * K2) + K3] / b. `Prices` adds what the
authors' code bills on Alibaba Function Compute beyond the paper's formula: the function's memory
(GB-s), the vCPUs a GPU function carries, and GPU invocations billed in whole seconds. Those three
are what make a 2 GB GPU function cheaper than a 24 GB one in the paper's Table I; with the paper's
Eq. 6 alone (Eq. 16), the cost would not depend on m and the whole GPU would always win.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Prices:
    """Unit prices: K1 per vCPU-second, K2 per GB of GPU memory per second, K3 per invocation."""

    vcpu_s: float
    gpu_gb_s: float
    invocation: float
    mem_gb_s: float = 0.0
    gpu_billing_s: float = 0.0  # GPU invocations are billed in whole multiples of this (0: exact)

    def invocation_cost(self, duration_s: float, vcpu: float, mem_gb: float = 0.0, gpu_gb: float = 0.0) -> float:
        """What one invocation (one batch) of `duration_s` costs: the bracket of Eq. 6."""
        if gpu_gb and self.gpu_billing_s:
            duration_s = math.ceil(duration_s / self.gpu_billing_s) * self.gpu_billing_s
        return self.invocation + (vcpu * self.vcpu_s + mem_gb * self.mem_gb_s + gpu_gb * self.gpu_gb_s) * duration_s


# §V-A: Alibaba Function Compute, Shanghai, Nov. 2023, as the paper's Eq. 6 uses them ($).
PAPER_PRICES = Prices(vcpu_s=1.3e-5, gpu_gb_s=1.5e-5, invocation=1.3e-7)
# The authors' code (CNY): the same platform with memory billed and GPU calls billed per second.
# Table I's normalised costs come from these.
ALIBABA_FC_CNY = Prices(vcpu_s=9e-5, gpu_gb_s=1.1e-4, invocation=9e-7, mem_gb_s=9e-6, gpu_billing_s=1.0)

TIMEOUT_FORMULAS = ("eq5", "reference")


def equivalent_timeout(timeouts: Sequence[float], rates: Sequence[float], formula: str = "eq5") -> float:
    """Eq. 5 applied pairwise: the expected wait of a batch's first request in a group.

    Apps are taken in order of timeout; the first two fold into one app with the summed rate and
    T = T1 + eta2 * (1 - exp(-r1 (T2 - T1))) / r1, which then folds with the next (§III-B).

    `formula="reference"` is what the authors' code computes instead, T1 + eta2 * exp(-r1 T2 - T1);
    the paper's Table I plans come from it. It is here only to reproduce them.
    """
    if len(timeouts) != len(rates) or not timeouts:
        raise ValueError("equivalent_timeout: need one rate per timeout, at least one")
    if formula not in TIMEOUT_FORMULAS:
        raise ValueError(f"equivalent_timeout: formula must be one of {TIMEOUT_FORMULAS}, not {formula!r}")
    pairs = sorted(zip(timeouts, rates, strict=True), key=lambda p: p[0])
    if formula == "eq5":
        # the folded T stays <= T2 <= the rest, so one sort suffices
        t, r = pairs[0]
        for t2, r2 in pairs[1:]:
            total = r + r2
            t = t + (r2 / total) * (-math.expm1(-r * (t2 - t)) / r if r > 0 else t2 - t)
            r = total
        return t
    while len(pairs) > 1:  # the reference folds the two smallest, re-sorting after each fold
        (t1, r1), (t2, r2) = pairs[0], pairs[1]
        total = r1 + r2
        pairs = sorted([(t1 + (r2 / total) * math.exp(-r1 * t2 - t1), total), *pairs[2:]], key=lambda p: p[0])
    return pairs[0][0]


def expected_batch(batch: int, rate: float, timeout: float) -> int:
    """Requests a batch collects: the first plus those arriving within the timeout, capped at b (Eq. 9)."""
    if batch <= 1 or timeout <= 0:
        return 1
    return min(batch, int(math.floor(rate * timeout)) + 1)
