"""`faas-gpu remove` (`rm`, `delete`): remove one function, or those of a stack file."""

from __future__ import annotations

import argparse
import sys

from .common import add_common_flags, check, client_for, ns_body, stack_of


def cmd_remove(args: argparse.Namespace) -> int:
    stack = stack_of(args, required=bool(getattr(args, "yaml", None)) or not args.name)
    client = client_for(args, stack)
    if args.name:
        names = [args.name]
    else:
        names = [s.name for s in stack.select(args.filter)]
    failed = False
    for name in names:
        spec = stack.functions.get(name) if stack else None
        ns = args.namespace or (spec.namespace if spec else None)
        print(f"Deleting: {name}{'.' + ns if ns else ''}.")
        resp = client.request("DELETE", "/system/functions", json={"functionName": name, **ns_body(ns)})
        if resp.status_code == 404:
            print(f"faas-gpu: No existing function to remove: {name}", file=sys.stderr)
            failed = True
            continue
        check(resp, (200, 201, 202), f"remove {name}")
        print("Removing old function.")
    return 1 if failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("remove", aliases=["rm", "delete"], help="remove a function (or those of a stack file)")
    add_common_flags(p)
    p.add_argument("name", nargs="?")
    p.add_argument("--filter", help="with -f: only this function")
    p.add_argument("-n", "--namespace")
    p.set_defaults(func=cmd_remove)
