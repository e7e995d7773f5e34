"""`faas-gpu build`: shrink-wrap each function of the stack file and build it into the local image
store of the stack it finds (`faas_gpu.running.locate`, so from any folder); `--shrinkwrap`: only
write build/<fn>/, as faas-cli does, which needs no stack."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from faas_gpu.build import build as build_image
from faas_gpu.build import docker_build, shrinkwrap
from faas_gpu.contract import env as env_vars
from faas_gpu.imagestore import ImageStore

from .common import CliError, add_common_flags, located_for, stack_of


def cmd_build(args: argparse.Namespace) -> int:
    stack = stack_of(args)
    specs = stack.select(args.filter)
    store = None
    use_docker = args.docker or env_vars.RUNTIME.read() == "docker"
    if args.push and not use_docker:
        raise CliError("--push: needs a docker build (--docker, or FAAS_GPU_RUNTIME=docker)")
    build_args = build_args_of(args.build_arg or [])
    if not args.shrinkwrap and not use_docker and any(not spec.skip_build for spec in specs):
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
        elif use_docker:
            print(f"Building: {spec.image} with {spec.lang} template (docker build). Please wait..", flush=True)
            image_id = docker_build(
                spec, stack_dir=stack.stack_dir, build_args=build_args, docker_host=args.docker_host, push=args.push
            )
            print(f"Image: {spec.image} built ({image_id[:19]}).")
        else:
            print(f"Building: {spec.image} with {spec.lang} template. Please wait..", flush=True)
            before = store.get(spec.image) if store is not None else None
            with BuildProgress(spec.name) as progress:
                record = build_image(spec, store, stack_dir=stack.stack_dir, on_step=progress, reuse=not args.no_cache)
            if before is not None and before.folder == record.folder:
                print(f"Image: {record.image} is up to date (its handler, template and requirements are unchanged).")
            else:
                print(f"Image: {record.image} built.")
    return 0


class BuildProgress:
    """A build's steps as a bar on a terminal (shrink-wrap, environment, each pip install, publish);
    nothing when stderr is not a terminal (tqdm's `disable=None`), so logs and pipes stay as they were.
    Why steps and not pip's own output: pip runs quiet (its tail is shown when it fails), and an
    install that takes minutes should say that it is the one running."""

    def __init__(self, name: str, enabled: bool = True):
        """`enabled` False: never shown (`up --no-progress`)."""
        self._bar = tqdm(
            total=None,
            desc=name,
            unit="step",
            disable=None if enabled else True,
            file=sys.stderr,
            leave=False,
            mininterval=0,
        )
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


def build_args_of(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--build-arg: expected KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


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
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="build again even when the image store's image was built from the same handler, template and "
        "requirements (otherwise that one is kept, as Docker's layer cache keeps an unchanged build)",
    )
    p.add_argument(
        "--docker",
        action="store_true",
        help="docker build the template's Dockerfile and tag the function's image, as faas-cli build does "
        "(the default when FAAS_GPU_RUNTIME=docker)",
    )
    p.add_argument("--build-arg", action="append", help="KEY=VALUE for the docker build (e.g. BASE_IMAGE=...)")
    p.add_argument("--push", action="store_true", help="docker push each image to its registry after the build")
    p.add_argument("--docker-host", help="the engine (default $FAAS_GPU_DOCKER_HOST, DOCKER_HOST)")
    p.set_defaults(func=cmd_build)
