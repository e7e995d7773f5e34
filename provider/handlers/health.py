"""GET/HEAD /healthz: the liveness probe OpenFaaS's gateway and faas-cli expect."""

from __future__ import annotations

from flask import Response

from .http import text


def healthz() -> Response:
    return text("OK", 200)
