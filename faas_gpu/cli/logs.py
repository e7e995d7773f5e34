"""`faas-gpu logs`: a function's log lines from /system/logs, followed by default as faas-cli does
(`--no-follow` or `--follow=false`: print what is there and exit), with faas-cli's `--since`
(a Go duration) and `--since-time`."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta

import requests

from faas_gpu.contract.duration import parse_duration

from .common import CONNECT_TIMEOUT_S, TIMEOUT_S, CliError, add_common_flags, check, client_for, message_of, stack_of


def parse_go_duration(text: str) -> float:
    """A Go duration (`5m`, `1h30m`, `90s`, `1.5h`) in seconds; a bare number means seconds
    (`faas_gpu.contract.duration`, the provider's parser too)."""
    try:
        return parse_duration(text)
    except ValueError:
        raise CliError(f"--since: {text.strip()!r} is not a duration like 30s, 5m or 1h30m") from None


def cmd_logs(args: argparse.Namespace) -> int:
    client = client_for(args, stack_of(args, required=False))
    params = {"name": args.name, "follow": str(args.follow).lower(), "tail": str(args.tail)}
    if args.namespace:
        params["namespace"] = args.namespace
    if args.since_time:
        params["since"] = args.since_time
    elif args.since:
        since = datetime.now(UTC) - timedelta(seconds=parse_go_duration(args.since))
        params["since"] = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if args.instance:
        params["instance"] = args.instance
    resp = client.request(
        "GET",
        "/system/logs",
        params=params,
        stream=True,
        timeout=(CONNECT_TIMEOUT_S, None if args.follow else TIMEOUT_S),
    )
    if resp.status_code in (404, 501):
        raise CliError(_not_served(client, args, resp))
    check(resp, (200,), f"logs {args.name}")
    try:
        for line in resp.iter_lines():
            if not line.strip():
                continue
            try:
                m = json.loads(line)
                print(f"{m['timestamp']} {m['name']} ({m.get('instance', '')}) {str(m['text']).rstrip()}", flush=True)
            except (ValueError, KeyError, TypeError):
                print(line.decode(errors="replace"), flush=True)
    except requests.RequestException as exc:
        raise CliError(f"logs {args.name}: the stream broke: {exc}") from None
    return 0


def _not_served(client, args: argparse.Namespace, resp: requests.Response) -> str:
    """Why /system/logs answered 404 or 501. The CE gateway (and ours, as it) answers 501 with an
    empty body both for a function that does not exist and for a provider without logs
    (gateway/handlers/logs.go), so the function is looked up to tell the two apart."""
    params = {"namespace": args.namespace} if args.namespace else {}
    found = client.request("GET", f"/system/function/{args.name}", params=params)
    if found.status_code == 404:
        where = f" in namespace {args.namespace}" if args.namespace else ""
        return f"logs {args.name}: no such function{where}: {args.name} (see `faas-gpu list`)"
    said = message_of(resp)
    return f"logs {args.name}: the provider does not serve logs ({resp.status_code}{': ' + said if said else ''})"


GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
"""What Go's strconv.ParseBool takes, as cobra reads `--follow=VALUE`."""


def add_follow_flags(p: argparse.ArgumentParser) -> None:
    """`--follow` (the default), `--no-follow`, and faas-cli's `--follow=false` (a Go bool flag
    takes its value only after `=`, so `--follow NAME` still means follow NAME): each spelling
    is its own option string, which argparse matches whole before it splits on `=`."""
    p.add_argument(
        "--follow", dest="follow", action="store_true", default=True, help="stream new lines as they come (default)"
    )
    p.add_argument(
        "--no-follow",
        "--follow=false",
        dest="follow",
        action="store_false",
        help="print the lines there are and exit",
    )
    p.add_argument(*(f"--follow={v}" for v in GO_TRUE), dest="follow", action="store_true", help=argparse.SUPPRESS)
    others = [v for v in GO_FALSE if v != "false"]
    p.add_argument(*(f"--follow={v}" for v in others), dest="follow", action="store_false", help=argparse.SUPPRESS)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="print a function's logs")
    add_common_flags(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.add_argument("--tail", "--lines", dest="tail", type=int, default=-1, help="lines to show (-1: all)")
    p.add_argument("--since", help="only logs newer than this duration (30s, 5m, 1h)")
    p.add_argument("--since-time", help="only logs after this RFC3339 time")
    p.add_argument("--instance")
    add_follow_flags(p)
    p.set_defaults(func=cmd_logs)
