"""GET /system/info (faasd's `MakeInfoHandler`).

The provider port answers faas-provider's ProviderInfo; the gateway port wraps it the way the
OpenFaaS gateway does (`{"provider": ..., "version": ..., "arch": ...}`).
"""

from __future__ import annotations

import platform
from collections.abc import Callable

from flask import Response, jsonify


def make_info_handler(info: Callable[[], dict], *, gateway: bool) -> Callable[[], Response]:
    def handle() -> Response:
        body = info()
        if gateway:
            body = {"provider": body, "version": body["version"], "arch": platform.machine()}
        return jsonify(body)

    return handle
