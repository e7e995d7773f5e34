"""GET /api/v1/query: the one Prometheus query the OpenFaaS gateway sends (add_metrics.go).

The gateway asks Prometheus for each function's invocation count to fill `invocationCount` in
its listing; with no Prometheus beside us, the provider answers that query itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flask import Response, jsonify


def make_query_handler(counts: Mapping[tuple[str, str], int]) -> Callable[[], Response]:
    """`counts` is the Invoker's live `{(namespace, name): invocations}` (read at each query)."""

    def handle() -> Response:
        result = [
            {"metric": {"function_name": f"{name}.{ns}"}, "value": [0, str(count)]}
            for (ns, name), count in sorted(counts.items())
        ]
        return jsonify({"status": "success", "data": {"resultType": "vector", "result": result}})

    return handle
