"""POST /system/scale-function/<name>: set a function's replicas (faasd's `MakeReplicaUpdater`)."""

from __future__ import annotations

from collections.abc import Callable

from flask import Response

from .http import accepted, json_body, namespace_query, text

Scale = Callable[[str, object, str | None], tuple[object, str | None]]
"""`Provider.scale(name, body, namespace_query) -> (record, clamped)`; `clamped` is the message
that says the request was brought inside the function's bounds, or None."""


def make_scale_handler(scale: Scale) -> Callable[[str], Response]:
    """202 either way; a clamped request says so in the body, so faas-cli prints why."""

    def handle(name: str) -> Response:
        _record, clamped = scale(name, json_body(), namespace_query())
        return text(clamped, 202) if clamped else accepted()

    return handle
