"""`faas-gpu new`: a function folder from a template and its stack.yaml entry (offline)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import yaml

from faas_gpu.build import find_template, load_template
from faas_gpu.stack import DEFAULT_GATEWAY, NAME_RE

from .common import CliError, norm_url


def _stack_entry(name: str, lang: str, image: str) -> str:
    return f"  {name}:\n    lang: {lang}\n    handler: ./{name}\n    image: {image}\n"


def cmd_new(args: argparse.Namespace) -> int:
    name = args.name
    if not NAME_RE.match(name):
        raise CliError(f"new: function name {name!r} must match {NAME_RE.pattern}")
    cwd = Path.cwd()
    stack_file = Path(args.append) if args.append else cwd / "stack.yaml"
    if args.append:
        if not stack_file.is_file():
            raise CliError(f"new --append: {stack_file} does not exist")
        try:
            existing = yaml.safe_load(stack_file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise CliError(f"new --append: {stack_file}: not valid YAML: {exc}") from None
        if name in ((existing.get("functions") or {}) if isinstance(existing, dict) else {}):
            raise CliError(f"new: function {name} already exists in {stack_file}")
    elif stack_file.exists():
        raise CliError(f"new: {stack_file.name} already exists; use --append {stack_file.name}")
    dest = cwd / name
    if dest.exists():
        raise CliError(f"new: folder ./{name} already exists")
    template = load_template(find_template(args.lang, cwd))
    handler_src = template.path / template.handler_folder
    if handler_src.is_dir():
        shutil.copytree(handler_src, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    else:
        dest.mkdir()
    image = f"{args.prefix.rstrip('/')}/{name}:latest" if args.prefix else f"{name}:latest"
    entry = _stack_entry(name, args.lang, image)
    if args.append:
        text = stack_file.read_text()
        stack_file.write_text(text + ("" if text.endswith("\n") else "\n") + "\n" + entry)
    else:
        gateway = norm_url(args.gateway) if args.gateway else DEFAULT_GATEWAY
        stack_file.write_text(f"version: 1.0\nprovider:\n  name: openfaas\n  gateway: {gateway}\nfunctions:\n{entry}")
    gitignore = cwd / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    for ignore in ("template", "build", ".secrets"):
        if ignore not in lines:
            lines.append(ignore)
    gitignore.write_text("\n".join(lines) + "\n")
    if template.welcome_message.strip():
        print(template.welcome_message.strip())
    print(
        f"\nFunction created in folder: {name}\nStack file {'updated' if args.append else 'written'}: {stack_file.name}"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new", help="create a function from a template (offline)")
    p.add_argument("name")
    p.add_argument("--lang", default="python3-gpu", help="template (default python3-gpu)")
    p.add_argument("-a", "--append", help="add to this stack file instead of writing stack.yaml")
    p.add_argument("-p", "--prefix", help="image prefix, e.g. your registry user")
    p.add_argument("-g", "--gateway", help=f"gateway written to the stack file (default {DEFAULT_GATEWAY})")
    p.set_defaults(func=cmd_new)
