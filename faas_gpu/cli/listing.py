"""`faas-gpu list` (`ls`): the functions of a namespace, as faas-cli prints them.

(Not `list.py`: a module must not shadow the builtin its callers use.)"""

from __future__ import annotations

import argparse

from .common import Client, CliError, add_common_flags, check, client_for, json_of, stack_of


def list_functions(client: Client, namespace: str | None) -> list[dict]:
    params = {"namespace": namespace} if namespace else None
    fns = json_of(check(client.request("GET", "/system/functions", params=params), (200,), "list"), "list")
    if not isinstance(fns, list):
        raise CliError("list: the gateway did not answer with a JSON array")
    return fns


def cmd_list(args: argparse.Namespace) -> int:
    client = client_for(args, stack_of(args, required=False))
    fns = sorted(list_functions(client, args.namespace), key=lambda f: str(f.get("name", "")))
    if args.verbose:
        print(f"{'Function':<30}\t{'Image':<30}\t{'Invocations':<15}\t{'Replicas':<5}")
        for f in fns:
            print(
                f"{f.get('name', ''):<30}\t{f.get('image', ''):<30}\t"
                f"{int(f.get('invocationCount') or 0):<15}\t{f.get('replicas') or 0:<5}"
            )
    else:
        print(f"{'Function':<30}\t{'Invocations':<15}\t{'Replicas':<5}")
        for f in fns:
            print(f"{f.get('name', ''):<30}\t{int(f.get('invocationCount') or 0):<15}\t{f.get('replicas') or 0:<5}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", aliases=["ls"], help="list functions")
    add_common_flags(p)
    p.add_argument("-n", "--namespace")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_list)
