"""`faas-gpu logs`: a function's log lines from /system/logs, followed by default as faas-cli does
(`--no-follow` or `--follow=false`: print what is there and exit), with faas-cli's `--since`
(a Go duration) and `--since-time`."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime, timedelta

import requests

from .common import CONNECT_TIMEOUT_S, TIMEOUT_S, CliError, add_common_flags, check, client_for, message_of, stack_of

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """A Go duration (`5m`, `1h30m`, `90s`, `1.5h`) in seconds; a bare number means seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise CliError(f"--since: {text!r} is not a duration like 30s, 5m or 1h30m")
    return total


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
        raise CliError(f"logs {args.name}: the provider does not serve logs ({resp.status_code}: {message_of(resp)})")
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
