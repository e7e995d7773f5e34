"""What every faas-gpu daemon serves with: one gunicorn gthread worker, and a bearer-token guard.

One worker, many threads: each daemon keeps live state (replicas, worker processes, queues) in
that worker's memory, so the app is built in the worker (`load`) and closed when it exits.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from flask import Flask, Response
from flask import request as flask_request
from gunicorn.app.base import BaseApplication


class OneWorkerServer(BaseApplication):
    def __init__(
        self,
        binds: list[str],
        load: Callable[[], Any],
        close: Callable[[], None],
        *,
        threads: int = 32,
        timeout_s: int = 120,
        name: str = "faas-gpu",
    ):
        self._binds, self._load, self._close = binds, load, close
        self._threads, self._timeout, self._name = threads, timeout_s, name
        super().__init__()

    def load_config(self) -> None:
        for key, value in {
            "bind": self._binds,
            "workers": 1,
            "worker_class": "gthread",
            "threads": self._threads,
            "keepalive": 75,
            "timeout": self._timeout,
            "graceful_timeout": 40,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": self._name,
            "worker_exit": lambda _server, _worker: self._close(),
            "post_fork": _die_with_master,
        }.items():
            self.cfg.set(key, value)

    def load(self):
        return self._load()


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not header or not header.startswith("Bearer "):
        return None
    return header[7:].strip() or None


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of bytes: `hmac.compare_digest` raises TypeError on a non-ASCII
    str (`Authorization: Bearer ä` answered 500), and a header is whatever the client sent."""
    if given is None or not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


def unauthorized(message: str = "invalid token") -> Response:
    resp = Response(message + "\n", status=401, mimetype="text/plain")
    resp.headers["WWW-Authenticate"] = 'Bearer realm="faas-gpu"'
    return resp


def _die_with_master(server, _worker) -> None:
    """The worker stops with its master, even one killed with -9: SIGTERM at once, so it
    finishes its in-flight requests (nothing lost), closes its app (model workers, replicas)
    and frees the port for the master the supervisor starts next."""
    import signal

    from faas_gpu.procs import die_with_parent

    die_with_parent(signal.SIGTERM, parent_pid=server.pid)


def require_bearer_token(
    app: Flask, token: str, prefix: str = "/v1/", checked_by_route: Callable[[], bool] | None = None
) -> None:
    """Internal APIs answer 401 without `Authorization: Bearer <token>` (compared in constant time).
    `checked_by_route()`: True for a request whose route checks its caller itself (the GPU
    Manager's job route with a placement lease), which this guard lets through."""

    @app.before_request
    def _check_token():
        if flask_request.path.startswith(prefix):
            if checked_by_route is not None and checked_by_route():
                return None
            if not token_matches(bearer_token(flask_request.headers.get("Authorization")), token):
                return unauthorized()
        return None
