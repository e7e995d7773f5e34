"""The faas-provider REST API (`/system/*`), as faas-provider's serve.go routes it.

One blueprint serves both ports: the provider's (8081) and the gateway's (8080). They differ
where the CE gateway differs from faas-provider: the shape of /system/info, scale requests
(clamped on the gateway, 0 refused by the provider), /system/logs of an unknown function (501 on
the gateway), `/system/alert` (AlertManager's webhook, gateway only), and their metrics.

This module only wires routes: each verb lives in its own module under `provider/handlers/`
(faasd's layout) and is handed only the parts of the Provider it uses, so the file list of
`handlers/` reads like the API it serves.
"""

from __future__ import annotations

from flask import Blueprint

from .core import Provider
from .handlers.alert import make_alert_handler
from .handlers.auth import make_auth_check
from .handlers.delete import make_delete_handler
from .handlers.deploy import make_deploy_handler
from .handlers.errors import ERROR_HANDLERS
from .handlers.health import healthz
from .handlers.info import make_info_handler
from .handlers.instances import make_instances_reader
from .handlers.logs import make_logs_handler
from .handlers.namespaces import make_namespaces_lister, namespace_not_implemented
from .handlers.query import make_query_handler
from .handlers.read import make_read_handler
from .handlers.replicas import make_replica_reader
from .handlers.scale import make_scale_handler
from .handlers.secrets import make_secret_writer, make_secrets_lister
from .handlers.update import make_update_handler


def system_blueprint(provider: Provider, *, gateway: bool) -> Blueprint:
    """The routes of one port; `gateway` picks the gateway's /system/info shape."""
    p = provider
    bp = Blueprint("system", __name__)
    bp.before_app_request(make_auth_check(p.config.basic_auth, p.credentials.check))
    for exc_class, handler in ERROR_HANDLERS.items():
        bp.app_errorhandler(exc_class)(handler)

    route = bp.add_url_rule
    # functions
    route(
        "/system/functions", "list_functions", make_read_handler(p.namespace, p.store.list, p.status), methods=["GET"]
    )
    route("/system/functions", "deploy", make_deploy_handler(p.deploy), methods=["POST"])
    route("/system/functions", "update", make_update_handler(p.deploy), methods=["PUT"])
    route("/system/functions", "delete", make_delete_handler(p.delete), methods=["DELETE"])
    route("/system/function/<name>", "function_status", make_replica_reader(p.get, p.status), methods=["GET"])
    route(
        "/system/function/<name>/instances",
        "function_instances",
        make_instances_reader(p.get, p.instances),
        methods=["GET"],
    )
    route("/system/scale-function/<name>", "scale", make_scale_handler(p.scale, gateway=gateway), methods=["POST"])
    if gateway:
        route("/system/alert", "alert", make_alert_handler(p.scale_by_alert), methods=["POST"])
    # info, namespaces
    info = make_info_handler(p.info, gateway=gateway, gateway_version=p.gateway_version)
    route("/system/info", "info", info, methods=["GET"])
    route("/system/namespaces", "namespaces", make_namespaces_lister(p.config.namespaces), methods=["GET"])
    route("/system/namespace/<name>", "namespace", namespace_not_implemented, methods=["GET"])
    # secrets
    route("/system/secrets", "list_secrets", make_secrets_lister(p.namespace, p.secrets), methods=["GET"])
    route(
        "/system/secrets",
        "write_secret",
        make_secret_writer(p.namespace, p.secrets),
        methods=["POST", "PUT", "DELETE"],
    )
    # logs, health, the gateway's Prometheus query
    logs = make_logs_handler(p.namespace, p.store.get, p.logs, gateway=gateway)
    route("/system/logs", "logs", logs, methods=["GET"])
    route("/healthz", "healthz", healthz, methods=["GET", "HEAD"])
    route("/api/v1/query", "prometheus_query", make_query_handler(p.invoker.counts), methods=["GET"])
    return bp
