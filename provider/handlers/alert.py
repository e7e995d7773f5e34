"""POST /system/alert: AlertManager's webhook, as the CE gateway serves it (handlers/alerthandler.go).

The body is AlertManager's notification (`requests.PrometheusAlert`: `status`, `receiver`,
`alerts: [{status, labels: {alertname, function_name}}]`; other fields are ignored, as Go's
decoder ignores them). Each alert scales its function (`Provider.scale_by_alert`). Answers as CE:
200 with an empty body; 400 for a body that does not decode (naming the field here); 500 listing
the alerts whose scaling failed, one `[i] error` line each.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response

from ..runtime import LaunchError
from ..types import ValidationError
from .http import json_body


def parse_alerts(body: object) -> list[tuple[str, str]]:
    """(function_name, status) of each alert; ValidationError naming the first field of the wrong type."""
    if not isinstance(body, dict):
        raise ValidationError("body: must be an AlertManager webhook JSON object")
    for key in ("status", "receiver"):
        _string(body.get(key), key)
    alerts = body.get("alerts")
    if alerts is None:
        return []
    if not isinstance(alerts, list):
        raise ValidationError("alerts: must be a list of alerts")
    out = []
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if alert is None:
            alert = {}
        if not isinstance(alert, dict):
            raise ValidationError(f"{where}: must be an object with status and labels")
        status = _string(alert.get("status"), f"{where}.status")
        labels = alert.get("labels")
        labels = {} if labels is None else labels
        if not isinstance(labels, dict):
            raise ValidationError(f"{where}.labels: must be an object")
        _string(labels.get("alertname"), f"{where}.labels.alertname")
        out.append((_string(labels.get("function_name"), f"{where}.labels.function_name"), status))
    return out


def _string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError(f"{where}: must be a string")
    return value


def make_alert_handler(scale_by_alert: Callable[[str, str], None]) -> Callable[[], Response]:
    """`scale_by_alert` is `Provider.scale_by_alert(function_name, status)`."""

    def handle() -> Response:
        alerts = parse_alerts(json_body())
        errors = []
        for function_name, status in alerts:
            try:
                scale_by_alert(function_name, status)
            except LaunchError as exc:
                errors.append(str(exc))
        if errors:
            return Response("".join(f"[{i}] {e}\n" for i, e in enumerate(errors)), status=500, mimetype="text/plain")
        return Response(status=200)

    return handle
