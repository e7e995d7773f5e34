"""`faas-gpu rollback NAME`: deploy a function's previous version again (`kubectl rollout undo`).

The provider keeps the version before the current one (skipping one that never served) and shows
it in the function's status (`faasGpuPrevious` of GET /system/function/NAME); this command sends
it back with the same PUT /system/functions faas-cli's deploy sends, so it works through any
gateway, the OpenFaaS CE gateway included. Where the previous version's replicas still run (a
rollout that stalled: they kept serving), they are the current version again at once and the new
ones are stopped; otherwise they start as for any deploy.
"""

from __future__ import annotations

import argparse

from .common import OK_DEPLOY, CliError, add_common_flags, check, client_for, json_of, message_of, stack_of


def cmd_rollback(args: argparse.Namespace) -> int:
    client = client_for(args, stack_of(args, required=False))
    params = {"namespace": args.namespace} if args.namespace else {}
    resp = client.request("GET", f"/system/function/{args.name}", params=params)
    if resp.status_code == 404:
        raise CliError(f"rollback: no such function: {args.name}")
    status = json_of(check(resp, (200,), f"rollback {args.name}"), "rollback")
    previous = status.get("faasGpuPrevious")
    if not isinstance(previous, dict) or not previous.get("image"):
        raise CliError(
            f"rollback {args.name}: no earlier version to roll back to (none was deployed before this one, "
            "or the provider does not keep one)"
        )
    body = {**previous, "service": status.get("name") or args.name}
    if args.namespace or status.get("namespace"):
        body["namespace"] = args.namespace or status["namespace"]
    resp = client.request("PUT", "/system/functions", json=body)
    if resp.status_code not in OK_DEPLOY:
        raise CliError(f"rollback {args.name}: unexpected status {resp.status_code}: {message_of(resp)}")
    print(f"Rolled back {args.name} to its previous version (image {previous['image']}).")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollback", help="deploy a function's previous version again")
    add_common_flags(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.set_defaults(func=cmd_rollback)
