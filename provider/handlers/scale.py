"""POST /system/scale-function/<name>: set a function's replicas (faasd's `MakeReplicaUpdater`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from flask import Response

from .http import accepted, json_body, namespace_query, text


class Scale(Protocol):
    """`Provider.scale(name, body, namespace_query, gateway=) -> (record, clamped)`; `clamped` is
    the message that says the request was brought inside the function's bounds, or None."""

    def __call__(
        self, path_name: str, body: object, namespace_query: str | None, *, gateway: bool = False
    ) -> tuple[object, str | None]: ...


def make_scale_handler(scale: Scale, *, gateway: bool) -> Callable[[str], Response]:
    """202 either way; a clamped request says so in the body, so faas-cli prints why. On the
    gateway routes (`gateway`) 0 is the minimum and no max label means 5, as the CE gateway
    clamps; the provider API refuses 0, as faas-netes CE does."""

    def handle(name: str) -> Response:
        _record, clamped = scale(name, json_body(), namespace_query(), gateway=gateway)
        return text(clamped, 202) if clamped else accepted()

    return handle
