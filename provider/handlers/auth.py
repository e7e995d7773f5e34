"""Basic auth in front of `/system/*` (faas-provider's `auth.DecorateWithBasicAuth`).

Only /system/* is guarded: /healthz and the gateway's Prometheus query stay open, as OpenFaaS
leaves them.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response, request

from ..auth import REALM_HEADER
from .http import text


def make_auth_check(enabled: bool, check: Callable[[str | None], bool]) -> Callable[[], Response | None]:
    """A before-request hook: a 401 with the realm header for a /system/* call without valid
    credentials, None (go on) otherwise. `check` is `Credentials.check`."""

    def require_auth() -> Response | None:
        if request.path.startswith("/system/") and enabled:
            if not check(request.headers.get("Authorization")):
                resp = text("invalid credentials", 401)
                resp.headers[REALM_HEADER[0]] = REALM_HEADER[1]
                return resp
        return None

    return require_auth
