"""GET /system/namespaces and /system/namespace/<name> (faasd's `MakeNamespacesLister`).

The namespaces are fixed by configuration; the per-namespace CRUD of OpenFaaS Pro is answered
501 with the text the community edition sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flask import Response, jsonify

from .http import text


def make_namespaces_lister(namespaces: Sequence[str]) -> Callable[[], Response]:
    def handle() -> Response:
        return jsonify(list(namespaces))

    return handle


def namespace_not_implemented(name: str) -> Response:
    return text("Feature not implemented in this version of OpenFaaS", 501)
