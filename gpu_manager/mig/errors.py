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


class MigNotPermitted(MigError):
    """This manager may not create or destroy MIG instances (not root, no mig-config capability),
    or may not see the processes on an instance to destroy: answered 403, and the scheduler does
    not retry it. Raised before anything is drained when the privilege probe already says so."""

    def __init__(self, index: int, detail: str):
        super().__init__(f"gpu {index}: MIG geometry cannot be changed by this manager: {detail}")


class ProcessesUnseen(MigNotPermitted):
    """NVML will not list the processes on an instance to destroy (NO_PERMISSION: another user's
    or another container's): nothing says it is idle. Found before anything is drained; unlike
    NVML refusing a create or destroy, it says nothing lasting about this manager's privilege."""


class InstancesInUse(MigError):
    """NVML refused a destroy with NVML_ERROR_IN_USE though no process is visible on the instance
    (e.g. DCGM or another monitor holds a handle to it). What was half destroyed has been put back;
    answered 409 with `retry_after_s`, so the scheduler backs off rather than draining again at once."""

    def __init__(self, index: int, detail: str, retry_after_s: float = 60.0):
        self.retry_after_s = retry_after_s
        super().__init__(f"gpu {index}: {detail}")
