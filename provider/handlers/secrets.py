"""GET/POST/PUT/DELETE /system/secrets (faasd's `MakeSecretHandler`).

One handler per method group, as faas-provider routes them: listing is read-only; writes share
the parsing of the body and the namespace, then differ only in whether the secret must (PUT,
DELETE) or must not (POST) exist.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response, jsonify, request

from ..core import NotFoundError
from ..store import SecretStore
from ..types import ValidationError
from .http import accepted, json_body, namespace_query, text


def make_secrets_lister(namespace: Callable[[str | None], str], secrets: SecretStore) -> Callable[[], Response]:
    """Names only, never values: `[{"name", "namespace"}]`."""

    def handle() -> Response:
        ns = namespace(namespace_query())
        return jsonify([{"name": n, "namespace": ns} for n in secrets.list(ns)])

    return handle


def make_secret_writer(namespace: Callable[[str | None], str], secrets: SecretStore) -> Callable[[], Response]:
    """POST creates (409 if it exists), PUT replaces (404 if it does not), DELETE removes (404
    if it does not); a namespace in the body wins over `?namespace=`."""

    def handle() -> Response:
        name, value, body_ns = SecretStore.parse(json_body())
        ns = namespace(body_ns or namespace_query())
        exists = secrets.exists(ns, name)
        if request.method == "DELETE":
            if not secrets.delete(ns, name):
                raise NotFoundError(f"secret {name} not found in namespace {ns}")
            return accepted()
        if value is None:
            raise ValidationError("value: a value or rawValue is required")
        if request.method == "POST" and exists:
            return text(f"secret {name} already exists in namespace {ns}", 409)
        if request.method == "PUT" and not exists:
            raise NotFoundError(f"secret {name} not found in namespace {ns}")
        secrets.write(ns, name, value)
        return accepted()

    return handle
