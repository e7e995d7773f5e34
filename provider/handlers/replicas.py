"""GET /system/function/<name>: one function's status (faasd's `MakeReplicaReader`)."""

from __future__ import annotations

from collections.abc import Callable

from flask import Response, jsonify, request

from ..types import FunctionRecord
from .http import namespace_query


def make_replica_reader(
    get: Callable[[str, str | None], FunctionRecord],
    status: Callable[..., dict],
) -> Callable[[str], Response]:
    """`get` is Provider.get (404 when unknown; `name.namespace` accepted), `status` is
    Provider.status (`usage=True` adds CPU/memory, as `?usage=1` asks; `detail=True` the previous
    version, which `faas-gpu rollback` deploys again)."""

    def handle(name: str) -> Response:
        record = get(name, namespace_query())
        usage = request.args.get("usage", "").lower() in ("1", "true")
        return jsonify(status(record, usage=usage, detail=True))

    return handle
