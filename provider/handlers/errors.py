"""Exceptions to status lines: the verbs raise domain errors, this module gives them their reply.

Keeping the mapping in one place means a verb never builds an error response itself, and every
route answers the same error with the same status and text.
"""

from __future__ import annotations

from flask import Response, current_app
from werkzeug.exceptions import HTTPException

from faas_gpu.datastore import DatastoreUnavailable

from ..core import NotFoundError
from ..types import ValidationError
from .http import text


def bad_request(exc: ValidationError) -> Response:
    return text(str(exc), 400)


def not_found(exc: NotFoundError) -> Response:
    return text(str(exc), 404)


def datastore_unavailable(exc: DatastoreUnavailable) -> Response:
    """The one place a datastore outage meets the control plane: a prompt 503 that names it."""
    resp = text(f"{exc}; retry later", 503)
    resp.headers["Retry-After"] = "1"
    return resp


def http_error(exc: HTTPException) -> Response:
    """werkzeug's own errors (405, 413, ...) as plain text; 413 names the configured limit."""
    if exc.code == 413:
        limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return text(f"body: request body is larger than the limit of {limit} bytes", 413)
    return text(f"{exc.name}: {exc.description}", exc.code or 500)


ERROR_HANDLERS = {
    ValidationError: bad_request,
    NotFoundError: not_found,
    DatastoreUnavailable: datastore_unavailable,
    HTTPException: http_error,
}
"""Exception class -> its handler, in the order `system.py` registers them."""
