"""POST /system/functions: deploy a function (faasd's `MakeDeployHandler`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from flask import Response

from .http import accepted, json_body, namespace_query


class Deploy(Protocol):
    """`Provider.deploy`: validates, stores and starts a FunctionDeployment; `update` says
    whether the function must exist already (PUT) or may be new (POST)."""

    def __call__(self, body: object, namespace_query: str | None, *, update: bool) -> object: ...


def make_deploy_handler(deploy: Deploy) -> Callable[[], Response]:
    """A new function, or a redeploy of an existing one: 202, as faas-provider answers."""

    def handle() -> Response:
        deploy(json_body(), namespace_query(), update=False)
        return accepted()

    return handle
