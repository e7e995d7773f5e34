"""The daemon's read-only status endpoint (`--status-port`): `GET /status` on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_status(status: Callable[[], dict], port: int) -> ThreadingHTTPServer:
    """`GET /status` on 127.0.0.1: the status as JSON; read-only, loopback only.

    `status` is `Procurer.status`: the server is handed only the one thing it reads."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path.split("?", 1)[0] not in ("/status", "/"):
                self.send_error(404, "only /status is served")
                return
            body = json.dumps(status()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="procure-status", daemon=True).start()
    return server
