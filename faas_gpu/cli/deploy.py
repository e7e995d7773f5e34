"""`faas-gpu deploy`: deploy the functions of a stack file the way faas-cli does (PUT, then POST on
404; `--replace`: DELETE, then POST). `up` deploys through the same `deploy_specs`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

import requests

from faas_gpu.stack import FunctionSpec

from .common import OK_DEPLOY, Client, CliError, add_common_flags, check, client_for, message_of, ns_body, stack_of


def deploy_one(client: Client, spec: FunctionSpec, replace: bool = False) -> requests.Response:
    """faas-cli: PUT, and POST on 404; `--replace` sends DELETE then POST."""
    body = spec.to_deployment()
    if replace:
        client.request("DELETE", "/system/functions", json={"functionName": spec.name, **ns_body(spec.namespace)})
        return client.request("POST", "/system/functions", json=body)
    resp = client.request("PUT", "/system/functions", json=body)
    if resp.status_code == 404:
        resp = client.request("POST", "/system/functions", json=body)
    return resp


def deploy_specs(client: Client, specs: Iterable[FunctionSpec], replace: bool = False) -> list[str]:
    """Deploy each function; all are tried, then a CliError names the ones that failed."""
    deployed, failed = [], []
    for spec in specs:
        print(f"Deploying: {spec.name}.", flush=True)
        resp = deploy_one(client, spec, replace)
        if resp.status_code == 401:
            check(resp, OK_DEPLOY, f"deploy {spec.name}")
        if resp.status_code in OK_DEPLOY:
            suffix = f".{spec.namespace}" if spec.namespace else ""
            print(f"\nDeployed. {resp.status_code} {resp.reason or 'OK'}.")
            print(f"URL: {client.gateway}/function/{spec.name}{suffix}\n")
            deployed.append(spec.name)
        else:
            print(
                f"faas-gpu: deploy {spec.name}: unexpected status {resp.status_code}: {message_of(resp)}"
                + _store_hint(client, message_of(resp)),
                file=sys.stderr,
            )
            failed.append(f"{spec.name} ({resp.status_code})")
    if failed:
        raise CliError(f"failed to deploy: {', '.join(failed)}")
    return deployed


def _store_hint(client: Client, message: str) -> str:
    """An image the provider does not find: say which store `faas-gpu build` from here fills."""
    if "image store" not in message or client.located is None:
        return ""
    if client.located.images is None:
        return f" ({client.located.not_found('build')})"
    return f" (`faas-gpu build` from here builds into {client.located.images}, {client.located.describe()})"


def cmd_deploy(args: argparse.Namespace) -> int:
    stack = stack_of(args)
    deploy_specs(client_for(args, stack), stack.select(args.filter), replace=args.replace)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deploy", help="deploy the functions of a stack file")
    add_common_flags(p)
    p.add_argument("--filter", help="only this function")
    p.add_argument("--replace", action="store_true", help="delete, then create")
    p.set_defaults(func=cmd_deploy)
