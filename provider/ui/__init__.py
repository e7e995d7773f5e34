"""The status page at the gateway's `/ui/` (where OpenFaaS's gateway serves its portal).

`GET /ui/` is one HTML page with its script and style under `/ui/static/` (files of this package,
nothing from outside the stack); the script fetches `GET /ui/api/status` (`status.StatusCollector`)
every few seconds and draws functions, GPU units, the scheduler, reconfigurations and procurement.
Its invoke form posts to `/function/<name>` on the same origin, as the portal's does.

Every route here takes the same basic auth as `/system/*`, the JSON too. The page builds its DOM
with `textContent` only (no `innerHTML`), and the Content-Security-Policy below allows scripts,
styles and requests from this origin only, so a name in a report can never become markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flask import Blueprint, Response, request, send_from_directory

from ..auth import REALM_HEADER

STATIC = Path(__file__).with_name("static")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""Only this origin's files, no inline script or style: the page works without any CDN and
nothing injected into it could run."""


def ui_blueprint(status: Callable[[], dict], *, auth: bool, check: Callable[[str | None], bool]) -> Blueprint:
    """`status`: the page's JSON (a `StatusCollector`); `auth`, `check`: the provider's basic auth
    (`ProviderConfig.basic_auth`, `Credentials.check`), the same as /system/*."""
    bp = Blueprint("ui", __name__, url_prefix="/ui", static_folder=str(STATIC), static_url_path="/static")

    @bp.before_request
    def require_auth() -> Response | None:
        if auth and not check(request.headers.get("Authorization")):
            resp = Response("invalid credentials\n", status=401, mimetype="text/plain")
            resp.headers[REALM_HEADER[0]] = REALM_HEADER[1]
            return resp
        return None

    @bp.after_request
    def harden(resp: Response) -> Response:
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @bp.get("/")
    def page() -> Response:
        return send_from_directory(STATIC, "index.html", mimetype="text/html")

    @bp.get("/api/status")
    def api_status() -> Response:
        return Response(json.dumps(status()), mimetype="application/json")

    return bp
