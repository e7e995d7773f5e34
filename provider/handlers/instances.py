"""GET /system/function/<name>/instances: faas-gpu's addition to the provider API.

Each instance's batch, CPU, GPU share, r_low / r_up and rate, as the autoscaler sees them (or the
plain instance ids of a function no autoscaler manages).
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response, jsonify

from ..types import FunctionRecord
from .http import namespace_query


def make_instances_reader(
    get: Callable[[str, str | None], FunctionRecord],
    instances: Callable[[FunctionRecord], dict],
) -> Callable[[str], Response]:
    def handle(name: str) -> Response:
        record = get(name, namespace_query())
        return jsonify(instances(record))

    return handle
