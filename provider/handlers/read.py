"""GET /system/functions: list a namespace's functions (faasd's `MakeReadHandler`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flask import Response, jsonify

from ..types import FunctionRecord
from .http import namespace_query


def make_read_handler(
    namespace: Callable[[str | None], str],
    records: Callable[[str], Iterable[FunctionRecord]],
    status: Callable[[FunctionRecord], dict],
) -> Callable[[], Response]:
    """`namespace` resolves `?namespace=` (Provider.namespace), `records` lists a namespace's
    records (FunctionStore.list), `status` turns one into OpenFaaS's FunctionStatus."""

    def handle() -> Response:
        ns = namespace(namespace_query())
        return jsonify([status(r) for r in records(ns)])

    return handle
