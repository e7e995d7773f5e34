"""Errors that cross a process boundary, typed, each with its HTTP status and a code.

Why: a caller must act on *what* went wrong, not on how it was worded. The scheduler used to
re-upload a model when a GPU Manager's 404 said "not been uploaded"; rewording the message would
have broken the GPU path silently. Now the answering side sets `X-Faas-Gpu-Error: <code>`
(`headers.ERROR`) and the caller compares codes (`code_of`). Messages stay for people: each still
names the field or thing at fault, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from .headers import ERROR


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


class ArtifactTooLarge(ContractError, ValueError):
    """Over the store's size limit (answered 413)."""

    status, code = 413, "artifact-too-large"


class ModelNotUploaded(ContractError, LookupError):
    """The job names a model digest this store does not hold (answered 404): upload it, then retry."""

    status, code = 404, "model-not-uploaded"


def error_headers(exc: ContractError) -> dict[str, str]:
    """The headers that carry `exc`'s code on an answer."""
    return {ERROR: exc.code}


def code_of(headers: Mapping[str, str]) -> str | None:
    """The error code an answer carries (None: none, or an answer from before codes)."""
    value = headers.get(ERROR)
    return value.strip() if value else None
