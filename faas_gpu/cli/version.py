"""`faas-gpu version`: the CLI's version, then the gateway's and provider's when one answers."""

from __future__ import annotations

import argparse

from faas_gpu import __version__

from .common import CliError, add_common_flags, client_for


def cmd_version(args: argparse.Namespace) -> int:
    print(f"faas-gpu CLI:\n version: {__version__}")
    client = client_for(args, None)
    try:
        resp = client.request("GET", "/system/info", timeout=3)
        info = resp.json() if resp.status_code == 200 else None
    except (CliError, ValueError):
        info = None
    if not isinstance(info, dict):
        return 0
    provider = info.get("provider")
    gateway_version = None
    if isinstance(provider, dict):  # the gateway's GatewayInfo wraps ProviderInfo, beside its own version
        name, orchestration, version = provider.get("provider"), provider.get("orchestration"), provider.get("version")
        gateway_version = info.get("version") if isinstance(info.get("version"), dict) else None
    else:  # a provider answering directly
        name, orchestration, version = provider, info.get("orchestration"), info.get("version")
    version = version if isinstance(version, dict) else {}
    print(f"\nGateway\n uri: {client.gateway}")
    if gateway_version is not None:
        print(f" version: {gateway_version.get('release', '')}\n sha: {gateway_version.get('sha', '')}")
    print(f"\nProvider\n name: {name}\n orchestration: {orchestration}")
    print(f" version: {version.get('release', '')}\n sha: {version.get('sha', '')}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="versions of the CLI and of the gateway")
    add_common_flags(p, stack=False)
    p.set_defaults(func=cmd_version)
