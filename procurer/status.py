"""The daemon's read-only status endpoint (`--status-port`): `GET /status` and `GET /metrics` on 127.0.0.1.

Both are open, as `/status` always was: the server listens on the loopback only, and what it
shows (node counts, prices, dollars) names no function; a Prometheus on the node scrapes it
without credentials.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST


def serve_status(
    status: Callable[[], dict], port: int, metrics: Callable[[], bytes] | None = None
) -> ThreadingHTTPServer:
    """`GET /status` on 127.0.0.1: the status as JSON; `GET /metrics` (with `metrics`): Prometheus's
    text format; read-only, loopback only.

    `status` is `Procurer.status`, `metrics` the procurer's exposition: the server is handed only
    the things it reads."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and metrics is not None:
                body, content_type = metrics(), CONTENT_TYPE_LATEST
            elif path in ("/status", "/"):
                body, content_type = json.dumps(status()).encode(), "application/json"
            else:
                self.send_error(404, "only /status and /metrics are served")
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="procure-status", daemon=True).start()
    return server
