"""`faas-gpu invoke`: stdin as the body of /function/<name> (or /async-function with `--async`),
without system credentials, as faas-cli sends it."""

from __future__ import annotations

import argparse
import sys

from .common import (
    CONNECT_TIMEOUT_S,
    DEFAULT_NAMESPACE,
    CliError,
    add_common_flags,
    client_for,
    key_values,
    message_of,
    stack_of,
)
from .progress import Progress, status_fetcher


def cmd_invoke(args: argparse.Namespace) -> int:
    client = client_for(args, stack_of(args, required=False))
    if sys.stdin.isatty():
        print("Reading from STDIN - hit (Control + D) to stop.", file=sys.stderr)
    data = sys.stdin.buffer.read()
    headers = key_values(args.header, "--header")
    query = key_values(args.query, "--query")
    if args.content_type:
        headers["Content-Type"] = args.content_type
    if args.callback_url:
        headers["X-Callback-Url"] = args.callback_url
    route = "async-function" if args.async_ else "function"
    path = f"/{route}/{args.name}.{args.namespace or DEFAULT_NAMESPACE}"
    with Progress(args.name, enabled=not args.no_progress and not args.async_) as progress:
        progress.watch(status_fetcher(client), args.namespace)  # a cold start's stages, on a terminal only
        resp = client.request(
            args.method.upper(),
            path,
            system=False,
            data=data,
            headers=headers,
            params=query,
            timeout=(CONNECT_TIMEOUT_S, None),
        )
    if args.async_:
        if resp.status_code != 202:
            raise CliError(f"invoke {args.name}: unexpected status {resp.status_code}: {message_of(resp)}")
        print(f"Function submitted asynchronously. X-Call-Id: {resp.headers.get('X-Call-Id', '')}", file=sys.stderr)
        return 0
    if not 200 <= resp.status_code < 300:
        raise CliError(f"Server returned unexpected status code: {resp.status_code} - {message_of(resp)}")
    sys.stdout.buffer.write(resp.content)
    sys.stdout.flush()
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("invoke", help="invoke a function with stdin as the body")
    add_common_flags(p)
    p.add_argument("name")
    p.add_argument("-n", "--namespace")
    p.add_argument("-a", "--async", dest="async_", action="store_true", help="use /async-function (202)")
    p.add_argument("-H", "--header", action="append", help="header key=value (repeatable)")
    p.add_argument("--query", action="append", help="query key=value (repeatable)")
    p.add_argument("-m", "--method", default="POST")
    p.add_argument("--content-type")
    p.add_argument("--callback-url", help="X-Callback-Url for --async")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line on a terminal while a first call loads its model (never shown in a pipe)",
    )
    p.set_defaults(func=cmd_invoke)
