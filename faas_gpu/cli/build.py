"""`faas-gpu build`: shrink-wrap each function of the stack file and build it into the local image
store of the stack it finds (`faas_gpu.running.locate`, so from any folder); `--shrinkwrap`: only
write build/<fn>/, as faas-cli does, which needs no stack."""

from __future__ import annotations

import argparse
from pathlib import Path

from faas_gpu.build import build as build_image
from faas_gpu.build import shrinkwrap
from faas_gpu.imagestore import ImageStore

from .common import CliError, add_common_flags, located_for, stack_of


def cmd_build(args: argparse.Namespace) -> int:
    stack = stack_of(args)
    specs = stack.select(args.filter)
    store = None
    if not args.shrinkwrap and any(not spec.skip_build for spec in specs):
        located = located_for(stack)
        if located.images is None:  # an image no stack reads would only be lost
            raise CliError(located.not_found("build"))
        store = ImageStore(located.images)
        print(f"Image store: {located.images} ({located.describe()})", flush=True)
    for spec in specs:
        if spec.skip_build:
            print(f"Skipping build of: {spec.name}.")
            continue
        if args.shrinkwrap:
            out = shrinkwrap(spec, stack.stack_dir)
            print(f"{spec.name} shrink-wrapped to {_rel(out)}")
        else:
            print(f"Building: {spec.image} with {spec.lang} template. Please wait..", flush=True)
            record = build_image(spec, store, stack_dir=stack.stack_dir)
            print(f"Image: {record.image} built.")
    return 0


def _rel(path: Path) -> str:
    try:
        return "./" + str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="shrink-wrap functions and build them into the local image store")
    add_common_flags(p)
    p.add_argument("--filter", help="only this function")
    p.add_argument("--shrinkwrap", action="store_true", help="only write build/<fn>/, as faas-cli does")
    p.set_defaults(func=cmd_build)
