"""What went wrong inside a worker: the caller's input, memory, or the device itself.

The three call for different answers. An input error (wrong shape, dtype) is the caller's: 400,
and the worker keeps serving. Out of memory (torch.OutOfMemoryError, a CUDA "out of memory", a
`MemoryError` on the cpu back end) is the unit's: the manager evicts other models and tries
once more, else answers 507 (it does not fit) or 503 (retry later), never 400. A device fault
(`torch.AcceleratorError`, "CUDA error: an illegal memory access", a device-side assert, an
ECC error) leaves the process's CUDA context unusable for good — CUDA's sticky errors: every
later call in that process fails — so the worker exits and is replaced; under MPS the fault is
fatal to every client of that unit's MPS server, which the manager restarts with its workers.
"""

from __future__ import annotations

OOM = "oom"
DEVICE = "device"
INPUT = "input"

# CUDA's sticky errors and what torch says for them (cudaErrorIllegalAddress, cudaErrorAssert,
# cudaErrorLaunchFailure, cudaErrorECCUncorrectable, ...): the context is lost, not the input bad
_DEVICE_MARKERS = (
    "cuda error",
    "cudaerror",
    "illegal memory access",
    "illegal instruction",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "uncorrectable ecc",
    "cublas_status_execution_failed",
    "cublas_status_internal_error",
    "cudnn_status_execution_failed",
    "cudnn_status_internal_error",
    "cuda driver error",
    "nvml_success == r internal assert",
    "launch timed out",
    "mps client",  # "MPS client failed to connect", the server's fault or its client limit
)


def classify(exc: BaseException) -> str:
    """OOM, DEVICE or INPUT for an exception a model's load or batch raised."""
    names = {t.__name__ for t in type(exc).__mro__}
    text = str(exc).lower()
    if names & {"OutOfMemoryError", "MemoryError"} or "out of memory" in text:
        return OOM
    if "AcceleratorError" in names or any(marker in text for marker in _DEVICE_MARKERS):
        return DEVICE
    return INPUT
