"""Exceptions to status lines: the verbs raise domain errors, this module gives them their reply.

Keeping the mapping in one place means a verb never builds an error response itself, and every
route answers the same error with the same status and text.
"""

from __future__ import annotations

import errno

from flask import Response, current_app
from werkzeug.exceptions import HTTPException

from faas_gpu.datastore import DatastoreFull, DatastoreUnavailable

from ..core import NotFoundError
from ..types import ValidationError
from .http import text

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""A write's errno for "no room": the disk is full, or the user's quota is spent."""


def bad_request(exc: ValidationError) -> Response:
    return text(str(exc), 400)


def not_found(exc: NotFoundError) -> Response:
    return text(str(exc), 404)


def datastore_unavailable(exc: DatastoreUnavailable) -> Response:
    """The one place a datastore outage meets the control plane: a prompt 503 that names it."""
    resp = text(f"{exc}; retry later", 503)
    resp.headers["Retry-After"] = "1"
    return resp


def insufficient_storage(exc: DatastoreFull | OSError) -> Response:
    """No room to write: 507 naming where (the state folder), never a bare 500. What was stored
    before is kept (the datastore's transaction, a secret's file, are replaced whole or not at all),
    and invocations go on: they write nothing the state folder must hold."""
    if isinstance(exc, DatastoreFull):
        return text(str(exc), 507)
    if exc.errno not in NO_SPACE:
        raise exc  # any other I/O error stays what it was: a 500
    folder = current_app.config.get("FAAS_GPU_STATE_FOLDER", "?")
    where = f" ({exc.filename})" if exc.filename else ""
    return text(
        f"the state folder {folder} is out of disk space{where}: {exc.strerror}; the request was not completed "
        "and what was stored before is kept: free space there, then retry",
        507,
    )


def http_error(exc: HTTPException) -> Response:
    """werkzeug's own errors (405, 413, ...) as plain text; 413 names the configured limit."""
    if exc.code == 413:
        limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return text(f"body: request body is larger than the limit of {limit} bytes", 413)
    return text(f"{exc.name}: {exc.description}", exc.code or 500)


ERROR_HANDLERS = {
    ValidationError: bad_request,
    NotFoundError: not_found,
    DatastoreFull: insufficient_storage,
    DatastoreUnavailable: datastore_unavailable,
    OSError: insufficient_storage,
    HTTPException: http_error,
}
"""Exception class -> its handler, in the order `system.py` registers them."""
