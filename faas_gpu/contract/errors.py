"""Errors that cross a process boundary, typed, each with its HTTP status and a code.

Why: a caller must act on *what* went wrong, not on how it was worded. The scheduler used to
re-upload a model when a GPU Manager's 404 said "not been uploaded"; rewording the message would
have broken the GPU path silently. Now the answering side sets `X-Faas-Gpu-Error: <code>`
(`headers.ERROR`) and the caller compares codes (`code_of`). Messages stay for people: each still
names the field or thing at fault, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from .headers import DEADLINE_MISSED, ERROR


class ContractError(Exception):
    """Base of the typed errors: `status` is what the answering side sends, `code` what a caller reads."""

    status: int = 500
    code: str = "internal"


class ValidationError(ContractError, ValueError):
    """Bad input from a client: answered 400 with this message, which names the field."""

    status, code = 400, "invalid"


class WireError(ContractError, ValueError):
    """A malformed tensor message (answered 400, naming what is wrong)."""

    status, code = 400, "bad-tensor"


class ArtifactError(ContractError, ValueError):
    """Corrupt, not a torch artifact, or not one the manager loads (answered 400)."""

    status, code = 400, "bad-artifact"


class BatchRefused(ContractError, ValueError):
    """A batch whose size (its first dimension) the model does not accept, by the limits read from
    its archive (`faas_gpu.models.batch_limits`): answered 400 by the scheduler and the GPU Manager
    before anything is placed, loaded or run, naming the dimension and what the model accepts."""

    status, code = 400, "batch-refused"


class ArtifactTooLarge(ContractError, ValueError):
    """Over the store's size limit (answered 413)."""

    status, code = 413, "artifact-too-large"


class ModelNotUploaded(ContractError, LookupError):
    """The job names a model digest this store does not hold (answered 404): upload it, then retry."""

    status, code = 404, "model-not-uploaded"


class DeadlineMissed(ContractError, TimeoutError):
    """A strict job whose deadline passed before a GPU unit could start it: answered 504, not run,
    by whichever daemon held it last (the scheduler's queues, or a GPU Manager's unit for a batch
    sent to it directly under a lease). One wording and one code for both, so the instance and
    the metrics treat the two the same."""

    status, code = 504, "deadline-missed"

    def __init__(self, job: str, late_ms: float):
        super().__init__(
            f"job {job}: missed its deadline ({max(0.0, late_ms):.0f} ms past it) before a GPU unit could start it; "
            "not run"
        )
        self.late_ms = late_ms


def deadline_missed_headers(exc: DeadlineMissed) -> dict[str, str]:
    """What an answer of `exc` carries: its code and `X-Faas-Gpu-Deadline-Missed: true` (the
    instance answers it and does not retry it)."""
    return {ERROR: exc.code, DEADLINE_MISSED: "true"}


def error_headers(exc: ContractError) -> dict[str, str]:
    """The headers that carry `exc`'s code on an answer."""
    return {ERROR: exc.code}


def code_of(headers: Mapping[str, str]) -> str | None:
    """The error code an answer carries (None: none, or an answer from before codes)."""
    value = headers.get(ERROR)
    return value.strip() if value else None
