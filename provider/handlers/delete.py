"""DELETE /system/functions: remove a function (faasd's `MakeDeleteHandler`)."""

from __future__ import annotations

from collections.abc import Callable

from flask import Response

from .http import accepted, json_body, namespace_query


def make_delete_handler(delete: Callable[[object, str | None], None]) -> Callable[[], Response]:
    """`delete` is `Provider.delete(body, namespace_query)`: the body names the function
    (`{"functionName": ...}`), as faas-cli sends it."""

    def handle() -> Response:
        delete(json_body(), namespace_query())
        return accepted()

    return handle
