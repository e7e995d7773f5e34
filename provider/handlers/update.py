"""PUT /system/functions: update a deployed function (faasd's `MakeUpdateHandler`).

The same domain verb as deploy, with `update=True`, so an unknown function is a 404 rather than
a new deployment.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response

from .deploy import Deploy
from .http import accepted, json_body, namespace_query


def make_update_handler(deploy: Deploy) -> Callable[[], Response]:
    def handle() -> Response:
        deploy(json_body(), namespace_query(), update=True)
        return accepted()

    return handle
