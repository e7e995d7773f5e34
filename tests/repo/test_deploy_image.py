"""deploy/Dockerfile built for real on the Debian-built base, with no network, and its daemons start.

Why: the deploy files' tests read the files; this one runs the build a user without the internet
runs (`--build-arg BASE_IMAGE=faas-gpu/base:latest`): the base already holds every dependency,
so the build must not ask pip for anything (the test host's dockerd has no route out at all),
and the image's entry point must start each daemon's parser.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from faas_gpu.paths import REPO_ROOT

try:  # the engine harness (tests/docker_fixtures.py) comes with the Docker runtimes' work
    import tests.docker_fixtures  # noqa: F401

    HARNESS = True
except ImportError:
    HARNESS = False

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a cold cache builds the base image first
    pytest.mark.skipif(not HARNESS, reason="no Docker engine harness (tests/docker_fixtures.py) in this checkout"),
]

STACK_TAG = "faas-gpu/stack:test"


def _context(target: Path) -> Path:
    """The repository's files as git knows them (tracked, and untracked but not ignored): the
    context a user's checkout gives `docker build`, without .venv, caches and state."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO_ROOT / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())
    return target


def test_the_stack_image_builds_offline_on_the_debian_base_and_runs_every_daemon(docker_host, tmp_path):
    client = docker_host.client
    context = _context(tmp_path / "context")
    client.images.get(docker_host.base_ref).tag("faas-gpu/base", "latest")
    image, logs = client.images.build(
        path=str(context),
        dockerfile="deploy/Dockerfile",
        buildargs={"BASE_IMAGE": "faas-gpu/base:latest"},
        tag=STACK_TAG,
        network_mode="none",  # nothing may be downloaded
        rm=True,
        forcerm=True,
    )
    output = "".join(chunk.get("stream", "") for chunk in logs)
    assert "Successfully installed" not in output, output  # the base held every dependency
    try:
        for argv in (
            ["faas-gpu", "--version"],
            ["faas-gpu", "serve", "--help"],
            ["python", "-m", "scheduler", "--help"],
            ["python", "-m", "gpu_manager", "--help"],
            ["python", "-c", "import torch, faas_gpu; print(faas_gpu.__file__)"],
        ):
            out = client.containers.run(STACK_TAG, argv, network_mode="none", remove=True).decode()
            assert out.strip(), argv
        located = client.containers.run(
            STACK_TAG, ["python", "-c", "import faas_gpu; print(faas_gpu.__file__)"], network_mode="none", remove=True
        ).decode()
        assert located.strip() == "/opt/faas-gpu/faas_gpu/__init__.py"  # the source tree, beside templates/
    finally:
        client.images.remove(image.id, force=True)
