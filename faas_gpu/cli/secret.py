"""`faas-gpu secret create|update|list|remove`: the provider's /system/secrets, with faas-cli's
status handling (409 on create of an existing secret, 404 on update of a missing one)."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

from .common import CliError, add_common_flags, check, client_for, json_of, ns_body, stack_of


def cmd_secret(args: argparse.Namespace) -> int:
    client = client_for(args, stack_of(args, required=False))
    ns = args.namespace
    action = {"ls": "list", "rm": "remove"}.get(args.action, args.action)
    if action == "list":
        params = {"namespace": ns} if ns else None
        items = json_of(
            check(client.request("GET", "/system/secrets", params=params), (200,), "secret list"), "secret list"
        )
        print("NAME")
        for s in items or []:
            print(s.get("name", "") if isinstance(s, dict) else s)
        return 0
    if not args.name:
        raise CliError(f"secret {action}: a secret name is required")
    if action == "remove":
        resp = client.request("DELETE", "/system/secrets", json={"name": args.name, **ns_body(ns)})
        if resp.status_code == 404:
            raise CliError(f"secret remove {args.name}: no such secret")
        check(resp, (200, 202), f"secret remove {args.name}")  # faas-cli: 204 is an error
        print("Removed.. OK.")
        return 0
    body: dict = {"name": args.name, **ns_body(ns)}
    if args.from_literal is not None and args.from_file:
        raise CliError(f"secret {action}: give --from-literal or --from-file, not both")
    if args.from_literal is not None:
        body["value"] = args.from_literal
    elif args.from_file:
        try:
            body["rawValue"] = base64.b64encode(Path(args.from_file).read_bytes()).decode()
        except OSError as exc:
            raise CliError(f"secret {action}: cannot read {args.from_file}: {exc.strerror}") from None
    else:
        if sys.stdin.isatty():
            print("Reading from STDIN - hit (Control + D) to stop.", file=sys.stderr)
        body["value"] = sys.stdin.read().strip()
    if not body.get("value") and not body.get("rawValue"):
        raise CliError(f"secret {action}: the secret value is empty")
    method = "POST" if action == "create" else "PUT"
    print(f"{'Creating' if method == 'POST' else 'Updating'} secret: {args.name}{'.' + ns if ns else ''}")
    resp = client.request(method, "/system/secrets", json=body)
    if resp.status_code == 409:
        raise CliError(f"secret {args.name} already exists; use `faas-gpu secret update`")
    if resp.status_code == 404 and method == "PUT":
        raise CliError(f"secret {args.name} does not exist; use `faas-gpu secret create`")
    check(resp, (200, 201, 202), f"secret {action} {args.name}")
    print(f"{'Created' if method == 'POST' else 'Updated'}: {resp.status_code} {resp.reason or 'OK'}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("secret", help="manage secrets: create|update|list|remove NAME")
    p.add_argument("action", choices=["create", "update", "list", "ls", "remove", "rm"])
    p.add_argument("name", nargs="?")
    add_common_flags(p)
    p.add_argument("-n", "--namespace")
    p.add_argument("--from-literal")
    p.add_argument("--from-file")
    p.set_defaults(func=cmd_secret)
