"""What a MIG reconfiguration can meet on the GPU: NVML refusing a step, MIG mode off, busy units.

The manager's API maps each to its HTTP answer; `InvalidGeometry` (a geometry the GPU cannot
take) belongs to planning, in `planning`.
"""

from __future__ import annotations


class MigError(RuntimeError):
    """NVML refused a step of a reconfiguration (the message names the step)."""


class MigModeOff(MigError):
    """The GPU is not in MIG mode (or cannot be): enabling it is the operator's act, not ours."""

    def __init__(self, index: int, detail: str):
        super().__init__(
            f"gpu {index}: {detail}; MIG geometry needs MIG mode on "
            f"(an operator enables it with `nvidia-smi -i {index} -mig 1`; this manager never changes it)"
        )


class UnitsBusy(MigError):
    """Units of the GPU still run jobs (or processes): they must be drained first."""

    def __init__(self, index: int, units: list[str]):
        self.units = list(units)
        super().__init__(f"gpu {index}: units still busy, not drained: {', '.join(self.units)}")


class UnknownGPU(LookupError):
    """A GPU index this node does not have (the API answers 404, not a MIG failure)."""
