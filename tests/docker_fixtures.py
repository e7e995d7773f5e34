"""Fixtures for the tests that run a real Docker Engine (a plugin: tests/conftest.py loads it, so
tests in any folder — tests/docker, tests/provider/docker, tests/e2e — share one session's hosts).

- `docker_host` (session): one `DockerHost` (tests.docker_hosts) with `faas-gpu/base:latest` built
  in it (python-deps loaded from ~/.cache/faas-gpu or built there once, then this checkout on top).
- `base_image_tar` (session): that image saved as a tar (cached by the checkout's digest), for
  other hosts to `docker load`.
- `swarm3` (session): a `Swarm`: manager 10.77.0.1 + worker1 10.77.0.2 + worker2 10.77.0.3 over a
  switch, the workers labelled gpu=true, a registry on the manager at 10.77.0.1:5000 holding
  `10.77.0.1:5000/faas-gpu/base:latest`, pulled on every host and tagged faas-gpu/base:latest
  there (`provision_base`; independent of `docker_host`).

Tests using them carry the `docker` marker. They skip only when dockerd, containerd, runc, unshare,
nsenter, ip or docker-registry is missing or the tests do not run as root (CI installs them
with `make servers`, so there they run).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faas_gpu import base_image
from tests.docker_hosts import REGISTRY, DockerHost, Swarm, make_swarm, missing_tools, provision_base, registry_seed

BASE_TAR_KEEP_S = 3600
"""Saved base images older than this are removed when a new one is saved (one per checkout digest)."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _require(*extra: str) -> None:
    missing = missing_tools(extra)
    if missing:
        pytest.skip(f"a real Docker Engine needs {', '.join(missing)} (Debian: make servers)")


@pytest.fixture(scope="session")
def docker_host() -> Iterator[DockerHost]:
    """One test host with its own dockerd and faas-gpu/base:latest built in it (`.base_ref` names
    the same image by its source digest; `.build_timings` says what the build took)."""
    _require()
    host = DockerHost("host")
    try:
        result = base_image.build(host.client, log=_log)
        host.base_ref = result.by_source  # type: ignore[attr-defined]
        host.build_timings = result.timings  # type: ignore[attr-defined]
        yield host
    finally:
        host.stop()


@pytest.fixture(scope="session")
def base_image_tar(docker_host: DockerHost) -> Path:
    """faas-gpu/base:latest of this checkout as a `docker save` tar (kept in ~/.cache/faas-gpu)."""
    ref = docker_host.base_ref  # type: ignore[attr-defined]
    folder = base_image.cache_dir()
    target = folder / f"base-{ref.rsplit(':', 1)[1]}.tar"
    if not target.is_file():
        start = time.monotonic()
        docker_host.client.images.get(ref).tag("faas-gpu/base", "latest")
        base_image.save_image(docker_host.client, base_image.BASE_IMAGE, target)
        _log(f"[base-image] docker save {target}: {time.monotonic() - start:.1f} s")
        for old in folder.glob("base-*.tar"):
            if old != target and time.time() - old.stat().st_mtime > BASE_TAR_KEEP_S:
                old.unlink(missing_ok=True)
    os.utime(target)
    return target


@pytest.fixture(scope="session")
def swarm3() -> Iterator[Swarm]:
    """Three hosts in one Swarm (manager + 2 gpu=true workers), faas-gpu/base:latest on all of
    them through the manager's registry (`swarm3.base_image` = its name there). Session-wide: a
    test that cuts a host restores it."""
    _require("docker-registry")
    start = time.monotonic()
    swarm = make_swarm(2, registry_seed=registry_seed(), log=_log)
    try:
        swarm.base_image = provision_base(swarm, log=_log)  # type: ignore[attr-defined]
        swarm.timings["total_s"] = round(time.monotonic() - start, 1)
        _log(f"[swarm3] ready: {swarm.timings} (registry {REGISTRY})")
        yield swarm
    finally:
        swarm.stop()
