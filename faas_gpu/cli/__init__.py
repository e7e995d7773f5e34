"""`faas-gpu`: the CLI. Reads the same stack file as faas-cli 0.18 and makes the same REST calls.

One module per command (`build`, `deploy`, `listing` for list, `describe`, `invoke`, `logs`,
`remove`, `rollback`, `secret`, `new`, `template`, `export`, `version`, `base-image`, `up`,
`down`), each with its `add_parser` and its `cmd_*`; what they share (gateway, credentials, the
HTTP client, stack loading) is in `common`. This module only assembles the parser and runs a
command. Commands whose parsing lives elsewhere (`up`, `down`, `sim`, `serve`,
`datastore`) get the rest of argv as it is.

The stack is found from any folder (`faas_gpu.running`): $FAAS_GPU_HOME > `.faas-gpu` beside the
stack file, then in the current folder > the running stack `up` recorded in the per-user config
(`down` clears it).
Gateway: `--gateway` > the stack's provider.gateway > $OPENFAAS_URL > the found stack's recorded
gateway > http://127.0.0.1:8080.
Credentials: `--username/--password`, else the found stack's files (`secrets/basic-auth-user` and
`basic-auth-password`), else faas-cli's saved login (config.yml in $OPENFAAS_CONFIG, ./.openfaas
when CI=true, else ~/.openfaas). `invoke` sends no system credentials, like faas-cli.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from faas_gpu import __version__, paths
from faas_gpu.imagestore import BuildError
from faas_gpu.stack import StackError

from . import (
    base_image,
    build,
    deploy,
    describe,
    export,
    invoke,
    listing,
    logs,
    new,
    remove,
    rollback,
    secret,
    template,
    version,
)
from .common import Client, CliError, credentials, gateway_url
from .deploy import deploy_specs
from .logs import parse_go_duration
from .template import template_pull
from .up import up_deploy, wait_ready

__all__ = [
    "CliError",
    "Client",
    "build_parser",
    "credentials",
    "deploy_specs",
    "gateway_url",
    "main",
    "parse_go_duration",
    "template_pull",
    "up_deploy",
    "wait_ready",
]

DELEGATED = {
    "up": ("faas_gpu.cli.up", "main", "start the stack, then build and deploy stack.yml"),
    "down": ("faas_gpu.cli.down", "main", "stop the stack"),
    "sim": ("faas_gpu.sim.cli", "main", "replay a trace against the placement policies"),
    "serve": ("provider.server", "main", "run the stack in the foreground (what `up` starts)"),
    "datastore": (
        "provider.datastore_cli",
        "main",
        "check the datastore's records, adopt an older version's, turn etcd's authentication on",
    ),
}
"""Commands that parse their own arguments: module, function, help."""

COMMANDS = (
    build,
    deploy,
    listing,
    describe,
    invoke,
    logs,
    remove,
    rollback,
    secret,
    new,
    template,
    export,
    version,
    base_image,
)
"""The command modules, in the order `faas-gpu --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faas-gpu", description="GPU-aware serverless inference for OpenFaaS")
    parser.add_argument("--version", action="version", version=f"faas-gpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, (_, _, help_text) in DELEGATED.items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)

    from faas_gpu.profiling.cli import add_parser as add_profile_parser
    from faas_gpu.profiling.colocation_cli import add_parser as add_colocation_parser
    from faas_gpu.profiling.fit_cli import add_parser as add_fit_parser

    add_profile_parser(sub)
    add_colocation_parser(sub)
    add_fit_parser(sub)

    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _fail(exc: BaseException) -> int:
    print(f"faas-gpu: {exc}", file=sys.stderr)
    return 1


PROJECT_COMMANDS = ("new", "template", "export")
"""Commands that write only into the user's project; every other one may write the state folder."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    private = not argv or argv[0] not in PROJECT_COMMANDS
    previous = os.umask(paths.PRIVATE_UMASK) if private else None
    try:
        return _main(argv)
    finally:
        if previous is not None:
            os.umask(previous)  # called in-process (tests), the caller's umask comes back


def _main(argv: list[str]) -> int:
    """Every command; state.db, logs, pid files and images come out 0700 / 0600, like the secrets."""
    try:
        if argv and argv[0] in DELEGATED:  # everything after the word goes to the other module
            module, func, _ = DELEGATED[argv[0]]
            return getattr(importlib.import_module(module), func)(argv[1:]) or 0
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (CliError, StackError, BuildError) as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
