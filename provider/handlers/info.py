"""GET /system/info (faasd's `MakeInfoHandler`, the CE gateway's handlers/infohandler.go).

The provider port answers faas-provider's ProviderInfo; the gateway port wraps it the way the
OpenFaaS gateway does: `{"provider": <ProviderInfo>, "version": <the gateway's own VersionInfo>,
"arch": <GOARCH>}`. The gateway's version is its own object (CE fills it from the gateway's build,
not from the provider); faas-gpu's gateway and provider are one program, so the release and sha
agree. `arch` is what Go's `runtime.GOARCH` would say on this machine (`amd64`, `arm64`), not
Python's `platform.machine()` (`x86_64`, `aarch64`).
"""

from __future__ import annotations

import platform
from collections.abc import Callable

from flask import Response, jsonify

GOARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv6l": "arm",
    "armv7l": "arm",
    "armv8l": "arm",
    "i386": "386",
    "i486": "386",
    "i586": "386",
    "i686": "386",
    "x86": "386",
    "ppc64le": "ppc64le",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "mips64": "mips64",
    "loongarch64": "loong64",
}


def go_arch(machine: str | None = None) -> str:
    """Go's name for the machine (`platform.machine()` when not given); unknown names lower-cased."""
    m = (platform.machine() if machine is None else machine).strip().lower()
    return GOARCH.get(m, m)


def make_info_handler(
    info: Callable[[], dict], *, gateway: bool, gateway_version: Callable[[], dict] | None = None
) -> Callable[[], Response]:
    """`info` is Provider.info (ProviderInfo); `gateway_version` the gateway's VersionInfo."""

    def handle() -> Response:
        body = info()
        if gateway:
            version = gateway_version() if gateway_version is not None else dict(body["version"])
            body = {"provider": body, "version": version, "arch": go_arch()}
        return jsonify(body)

    return handle
