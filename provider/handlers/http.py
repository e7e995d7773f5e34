"""What every `/system/*` verb shares: plain-text replies, the JSON body, the namespace query.

faas-provider answers errors as one plain-text line and successes of writes as an empty 202; these
helpers keep every verb's replies the same shape.
"""

from __future__ import annotations

from flask import Response, request

from faas_gpu.serving import parse_json_body

from ..types import ValidationError


def text(message: str, status: int) -> Response:
    """A plain-text reply of one line, as faas-provider writes its errors."""
    return Response(message + "\n", status=status, mimetype="text/plain")


def accepted() -> Response:
    """The empty 202 a successful write gets."""
    return Response(status=202)


def json_body() -> object:
    """The request's JSON: every /system/* route reads its body here, so bad JSON is one 400."""
    raw = request.get_data(cache=False)  # within the app's MAX_CONTENT_LENGTH (413 beyond)
    if not raw:
        raise ValidationError("body: is required")
    try:
        return parse_json_body(raw, max_bytes=len(raw))
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def namespace_query() -> str | None:
    """`?namespace=`, or None when absent or empty (the Provider then picks the default)."""
    return request.args.get("namespace") or None
