"""`faas-gpu base-image`: build faas-gpu/base (Debian + torch + faas-gpu) with no image registry.

See `faas_gpu.base_image` for the steps and the cache (~/.cache/faas-gpu)."""

from __future__ import annotations

import argparse
from pathlib import Path

from faas_gpu import base_image

from .common import CliError


def cmd_base_image(args: argparse.Namespace) -> int:
    try:
        client = base_image.client_for(args.docker_host)
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' errors or OSError
        raise CliError(f"no Docker Engine at {args.docker_host or 'DOCKER_HOST / the default socket'}: {exc}") from exc
    try:
        result = base_image.build(client, rootfs=Path(args.rootfs) if args.rootfs else None, tag=args.tag)
    except base_image.BaseImageError as exc:
        raise CliError(str(exc)) from exc
    finally:
        client.close()
    print(result.base)
    print(" ".join(f"{k}={v}s" for k, v in result.timings.items()))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("base-image", help="build the faas-gpu/base image from Debian packages and local wheels")
    p.add_argument("--rootfs", help="a Debian bookworm root file system tar to use instead of running mmdebstrap")
    p.add_argument("--docker-host", help="the engine to build in (unix:///path, tcp://host:port; default $DOCKER_HOST)")
    p.add_argument("--tag", default=base_image.BASE_IMAGE, help=f"the image's name (default {base_image.BASE_IMAGE})")
    p.set_defaults(func=cmd_base_image)
