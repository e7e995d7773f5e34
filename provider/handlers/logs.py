"""GET /system/logs: a function's log lines as NDJSON, optionally followed (faasd's `logs`).

The query is parsed before anything is read, so a bad one is a 422 (as faas-provider answers);
a followed stream ends when the client hangs up, even while no lines arrive.

The two ports answer as their OpenFaaS counterparts do. The provider API as faas-provider's
logs/handler.go: `Content-Type: application/x-ndjson`, 404 for an unknown function. The gateway
routes as the CE gateway's log proxy (gateway/handlers/logs.go): it maps the provider's 404 (and
501) to **501 with an empty body**, and streams a 200 without copying the provider's headers, so Go
sniffs the first lines and sends `text/plain; charset=utf-8`; the body is the same NDJSON.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import datetime

from flask import Response, request

from ..core import NotFoundError
from ..logs import LogStore, parse_time
from ..types import FunctionRecord, validate_name
from .http import text

GATEWAY_CONTENT_TYPE = "text/plain; charset=utf-8"
PROVIDER_CONTENT_TYPE = "application/x-ndjson"


def make_logs_handler(
    namespace: Callable[[str | None], str],
    record: Callable[[str, str], FunctionRecord | None],
    logs: LogStore,
    *,
    gateway: bool = False,
) -> Callable[[], Response]:
    """`namespace` resolves the query's namespace (Provider.namespace), `record` looks the
    function up (FunctionStore.get) so an unknown one is a 404 (501 on the gateway routes),
    `logs` reads the lines."""

    def handle() -> Response:
        args = request.args
        try:
            name = validate_name(args.get("name"), "name")
            ns = namespace(args.get("namespace") or None)
            tail = parse_tail(args.get("tail"))
            follow = (args.get("follow") or "false").lower() in ("1", "true")
            since: datetime | None = parse_time(args["since"]) if args.get("since") else None
        except ValueError as exc:
            return text(f"cannot parse the log request: {exc}", 422)
        if record(ns, name) is None:
            if gateway:
                return Response(status=501)
            raise NotFoundError(f"function {name}.{ns} not found")
        stop = threading.Event()
        client = request.environ.get("gunicorn.socket")
        watcher = disconnect_watcher(client, stop) if follow and client else None
        messages = logs.read(
            ns,
            name,
            instance=args.get("instance") or None,
            tail=tail,
            since=since,
            follow=follow,
            stop=stop,
        )

        def stream() -> Iterator[str]:
            try:
                for msg in messages:
                    yield json.dumps(msg) + "\n"
            finally:
                stop.set()
                if watcher:
                    watcher.join(timeout=1)

        return Response(stream(), content_type=GATEWAY_CONTENT_TYPE if gateway else PROVIDER_CONTENT_TYPE)

    return handle


MAX_TAIL = 2**63 - 1
"""Go's largest int: faas-provider reads `tail` with `strconv.Atoi`, which refuses anything larger."""


def parse_tail(raw: str | None) -> int:
    """`tail` as faas-provider reads it: a whole number (at most Go's largest int; 0 or less: all
    lines); ValueError naming the field otherwise."""
    if not raw:
        return 0
    try:
        tail = int(raw)
    except ValueError:
        raise ValueError(f"tail: {raw[:40]!r} is not a whole number") from None
    if tail > MAX_TAIL:
        raise ValueError(f"tail: {raw[:40]!r} is larger than {MAX_TAIL}")
    return tail


def disconnect_watcher(sock: socket.socket, stop: threading.Event) -> threading.Thread:
    """Ends a followed log stream when its client hangs up, even while no lines arrive."""

    def watch() -> None:
        while not stop.is_set():
            try:
                readable, _, _ = select.select([sock], [], [], 0.5)
                if readable and not sock.recv(1, socket.MSG_PEEK):
                    stop.set()
            except (OSError, ValueError):
                stop.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t
