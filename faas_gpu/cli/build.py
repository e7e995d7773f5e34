"""`faas-gpu build`: shrink-wrap each function of the stack file and build it into the local image
store of the stack it finds (`faas_gpu.running.locate`, so from any folder); `--shrinkwrap`: only
write build/<fn>/, as faas-cli does, which needs no stack."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

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
            with BuildProgress(spec.name) as progress:
                record = build_image(spec, store, stack_dir=stack.stack_dir, on_step=progress)
            print(f"Image: {record.image} built.")
    return 0


class BuildProgress:
    """A build's steps as a bar on a terminal (shrink-wrap, environment, each pip install, publish);
    nothing when stderr is not a terminal (tqdm's `disable=None`), so logs and pipes stay as they were.
    Why steps and not pip's own output: pip runs quiet (its tail is shown when it fails), and an
    install that takes minutes should say that it is the one running."""

    def __init__(self, name: str):
        self._bar = tqdm(total=None, desc=name, unit="step", disable=None, file=sys.stderr, leave=False, mininterval=0)
        self._begun = False

    def __call__(self, label: str, total: int) -> None:
        if self._begun:
            self._bar.update(1)
        self._begun = True
        self._bar.total = total
        self._bar.set_postfix_str(label)

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._begun and exc[0] is None:
            self._bar.update(1)
        self._bar.close()


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
