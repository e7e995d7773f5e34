"""The choices the paper leaves open, shared by the planner (Alg. 1) and the baselines (BATCH, MBS+).

They sit below both so that `planner` can call the baselines and the baselines can read the
options without importing the planner back (the two used to meet in a circle).
"""

from __future__ import annotations

from dataclasses import dataclass

from .provision import KINDS


@dataclass(frozen=True)
class Options:
    """Choices the paper leaves open. `Options.reference()` gives the authors' code's, for Table I.

    - timeout_formula: "eq5" (the paper's Eq. 5) or "reference" (the authors' code's; see cost.py)
    - merged_kinds: which function kinds funcProvision may give a merged group
    - mbs_vcpu_step / mbs_batch_stride: the lattice MBS+ probes (see baselines.py)
    """

    timeout_formula: str = "eq5"
    merged_kinds: tuple[str, ...] = KINDS
    mbs_vcpu_step: float = 0.5
    mbs_batch_stride: int = 5

    @classmethod
    def reference(cls) -> Options:
        return cls(timeout_formula="reference", merged_kinds=("gpu",))
