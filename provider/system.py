"""The faas-provider REST API (`/system/*`), as faas-provider's serve.go routes it.

One blueprint serves both ports: the provider's (8081) and the gateway's (8080), which differ
only in the shape of /system/info and in their metrics.
"""

from __future__ import annotations

import json
import platform
import select
import socket
import threading
from collections.abc import Callable
from datetime import datetime

from flask import Blueprint, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from faas_gpu.datastore import DatastoreUnavailable

from .auth import REALM_HEADER
from .core import NotFoundError, Provider
from .logs import parse_time
from .store import SecretStore
from .types import ValidationError, validate_name


def text(message: str, status: int) -> Response:
    return Response(message + "\n", status=status, mimetype="text/plain")


def accepted() -> Response:
    return Response(status=202)


def _json_body() -> object:
    """The request's JSON: every /system/* route reads its body here, so bad JSON is one 400."""
    raw = request.get_data(cache=False)
    if not raw:
        raise ValidationError("body: is required")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"body: invalid JSON ({exc})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise ValidationError("body: invalid JSON (nested too deeply)") from None


def system_blueprint(provider: Provider, *, gateway: bool) -> Blueprint:
    bp = Blueprint("system", __name__)
    ns_query = lambda: request.args.get("namespace") or None  # noqa: E731

    @bp.before_app_request
    def require_auth():
        if request.path.startswith("/system/") and provider.config.basic_auth:
            if not provider.credentials.check(request.headers.get("Authorization")):
                resp = text("invalid credentials", 401)
                resp.headers[REALM_HEADER[0]] = REALM_HEADER[1]
                return resp
        return None

    @bp.app_errorhandler(ValidationError)
    def bad_request(exc: ValidationError):
        return text(str(exc), 400)

    @bp.app_errorhandler(NotFoundError)
    def not_found(exc: NotFoundError):
        return text(str(exc), 404)

    @bp.app_errorhandler(DatastoreUnavailable)
    def datastore_unavailable(exc: DatastoreUnavailable):
        """The one place a datastore outage meets the control plane: a prompt 503 that names it."""
        resp = text(f"{exc}; retry later", 503)
        resp.headers["Retry-After"] = "1"
        return resp

    @bp.app_errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code == 413:
            limit = current_app.config.get("MAX_CONTENT_LENGTH")
            return text(f"body: request body is larger than the limit of {limit} bytes", 413)
        return text(f"{exc.name}: {exc.description}", exc.code or 500)

    # -- functions -----------------------------------------------------------------------
    @bp.get("/system/functions")
    def list_functions():
        ns = provider.namespace(ns_query())
        return jsonify([provider.status(r) for r in provider.store.list(ns)])

    @bp.post("/system/functions")
    def deploy():
        provider.deploy(_json_body(), ns_query(), update=False)
        return accepted()

    @bp.put("/system/functions")
    def update():
        provider.deploy(_json_body(), ns_query(), update=True)
        return accepted()

    @bp.delete("/system/functions")
    def delete():
        provider.delete(_json_body(), ns_query())
        return accepted()

    @bp.get("/system/function/<name>")
    def function_status(name: str):
        record = provider.get(name, ns_query())
        usage = request.args.get("usage", "").lower() in ("1", "true")
        return jsonify(provider.status(record, usage=usage))

    @bp.get("/system/function/<name>/instances")
    def function_instances(name: str):
        """faas-gpu's addition: each instance's batch, CPU, GPU share, r_low / r_up and rate."""
        record = provider.get(name, ns_query())
        return jsonify(provider.instances(record))

    @bp.post("/system/scale-function/<name>")
    def scale(name: str):
        _record, clamped = provider.scale(name, _json_body(), ns_query())
        return text(clamped, 202) if clamped else accepted()

    # -- info, namespaces ----------------------------------------------------------------
    @bp.get("/system/info")
    def info():
        body = provider.info()
        if gateway:
            body = {"provider": body, "version": body["version"], "arch": platform.machine()}
        return jsonify(body)

    @bp.get("/system/namespaces")
    def namespaces():
        return jsonify(list(provider.config.namespaces))

    @bp.route("/system/namespace/<name>", methods=["GET"])
    def namespace(name: str):
        return text("Feature not implemented in this version of OpenFaaS", 501)

    # -- secrets -------------------------------------------------------------------------
    @bp.get("/system/secrets")
    def list_secrets():
        ns = provider.namespace(ns_query())
        return jsonify([{"name": n, "namespace": ns} for n in provider.secrets.list(ns)])

    @bp.route("/system/secrets", methods=["POST", "PUT", "DELETE"])
    def write_secret():
        name, value, body_ns = SecretStore.parse(_json_body())
        ns = provider.namespace(body_ns or ns_query())
        exists = provider.secrets.exists(ns, name)
        if request.method == "DELETE":
            if not provider.secrets.delete(ns, name):
                raise NotFoundError(f"secret {name} not found in namespace {ns}")
            return accepted()
        if value is None:
            raise ValidationError("value: a value or rawValue is required")
        if request.method == "POST" and exists:
            return text(f"secret {name} already exists in namespace {ns}", 409)
        if request.method == "PUT" and not exists:
            raise NotFoundError(f"secret {name} not found in namespace {ns}")
        provider.secrets.write(ns, name, value)
        return accepted()

    # -- logs ----------------------------------------------------------------------------
    @bp.get("/system/logs")
    def logs():
        args = request.args
        try:
            name = validate_name(args.get("name"), "name")
            ns = provider.namespace(args.get("namespace") or None)
            tail = int(args.get("tail") or 0)
            follow = (args.get("follow") or "false").lower() in ("1", "true")
            since: datetime | None = parse_time(args["since"]) if args.get("since") else None
        except ValueError as exc:
            return text(f"cannot parse the log request: {exc}", 422)
        if provider.store.get(ns, name) is None:
            raise NotFoundError(f"function {name}.{ns} not found")
        stop = threading.Event()
        client = request.environ.get("gunicorn.socket")
        watcher = _disconnect_watcher(client, stop) if follow and client else None
        messages = provider.logs.read(
            ns,
            name,
            instance=args.get("instance") or None,
            tail=tail,
            since=since,
            follow=follow,
            stop=stop,
        )

        def stream():
            try:
                for msg in messages:
                    yield json.dumps(msg) + "\n"
            finally:
                stop.set()
                if watcher:
                    watcher.join(timeout=1)

        return Response(stream(), mimetype="application/x-ndjson")

    @bp.route("/healthz", methods=["GET", "HEAD"])
    def healthz():
        return text("OK", 200)

    @bp.get("/api/v1/query")
    def prometheus_query():
        """The one query the OpenFaaS gateway sends to Prometheus (add_metrics.go), answered."""
        result = [
            {"metric": {"function_name": f"{name}.{ns}"}, "value": [0, str(count)]}
            for (ns, name), count in sorted(provider.invoker.counts.items())
        ]
        return jsonify({"status": "success", "data": {"resultType": "vector", "result": result}})

    return bp


def _disconnect_watcher(sock: socket.socket, stop: threading.Event) -> threading.Thread:
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


ErrorHandler = Callable[[Exception], Response]
