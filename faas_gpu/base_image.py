"""The `faas-gpu/base` image, built from Debian packages and local wheels with no registry at all.

Why it exists: function images and the stack's own daemons need an image with Python, torch and
faas-gpu in it, and the machines this project runs on (CI included) reach no image registry, so
`python:3.11-slim` cannot be pulled. Everything comes from sources the host already trusts:

1. a Debian bookworm root file system made by `mmdebstrap` (Debian's apt mirror the host uses),
   `docker import`ed as `faas-gpu/debian-python:<hash>`;
2. a wheelhouse the host's own pip fills (`pip wheel`, the host's pip config: the local CPU torch
   wheel and the project's runtime dependencies), cached in ~/.cache/faas-gpu/wheelhouse-<hash>;
3. `faas-gpu/python-deps:<hash>`: the root file system plus /opt/venv (on PATH) installed from that
   wheelhouse with `pip install --no-index` (a docker build; no network inside), saved with
   `docker save` to ~/.cache/faas-gpu/python-deps-<hash>.tar, so that another run or another
   dockerd only `docker load`s it;
4. `faas-gpu/base:latest`: python-deps plus this checkout's source tree in /opt/faas-gpu, installed
   editable (`pip install -e`), so `faas_gpu.paths.REPO_ROOT` is /opt/faas-gpu and the templates,
   stack.yml and functions/ are where the sources expect them. Cheap: rebuilt per test session.

<hash> is a digest of the inputs (the package list, the requirements, the Dockerfile), so a change
to any of them makes a new image and the old cache entries are simply not used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faas_gpu import paths

SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
"""What mmdebstrap puts in the root file system: bookworm's Python is 3.11, the local torch wheel's ABI."""
TORCH_REQUIREMENT = "torch==2.13.0"
BUILD_REQUIREMENTS = ("setuptools>=68", "wheel")
"""For the editable install of the checkout in the image (`--no-build-isolation`, no index there)."""
TARGET_EXTRAS = ("async-timeout>=4.0.3",)
"""Dependencies the image's Python needs and the host's may not: the host's pip resolves markers for
itself, and bookworm's Python is 3.11.2 (redis wants async-timeout below 3.11.3)."""

ROOTFS_REPO = "faas-gpu/debian-python"
DEPS_REPO = "faas-gpu/python-deps"
BASE_IMAGE = "faas-gpu/base:latest"
BASE_REPO = "faas-gpu/base"
SOURCE_DIR = "/opt/faas-gpu"
VENV = "/opt/venv"
DOCKER_TIMEOUT = 900
"""Seconds for one engine call: loading or saving a 1 GB image on two busy cores takes a while."""

DEPS_DOCKERFILE = """\
# faas-gpu/python-deps: Debian bookworm + /opt/venv from a local wheelhouse (no network in here)
FROM {rootfs} AS build
COPY wheels /wheels
COPY requirements.txt /requirements.txt
RUN python3 -m venv {venv} \\
 && {venv}/bin/pip install --no-cache-dir --no-index --find-links /wheels -r /requirements.txt \\
 && {venv}/bin/python -c "import torch, numpy, flask, docker"

# a second stage, so the wheels never become a layer of the image
FROM {rootfs}
COPY --from=build {venv} {venv}
ENV VIRTUAL_ENV={venv} \\
    PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONUNBUFFERED=1 \\
    PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    LANG=C.UTF-8
LABEL org.opencontainers.image.title="faas-gpu python-deps" faas-gpu.inputs="{digest}"
"""

BASE_DOCKERFILE = """\
# faas-gpu/base: python-deps + this checkout, installed editable so templates/ is beside the sources
FROM {deps}
COPY src {src}
RUN chmod -R a+rX {src} \\
 && pip install --no-cache-dir --no-index --no-deps --no-build-isolation -e {src} \\
 && python -c "import faas_gpu, provider, scheduler, gpu_manager, procurer"
LABEL org.opencontainers.image.title="faas-gpu base" faas-gpu.source="{digest}"
"""

SKIP_PARTS = {".git", ".venv", "__pycache__", ".faas-gpu", ".pytest_cache", ".ruff_cache", ".hypothesis",
              ".import_linter_cache", "build", "template", "out"}  # fmt: skip
"""Folders never copied into the image when the checkout is not a git work tree."""


class BaseImageError(RuntimeError):
    """A step of the image build failed; the message says which and why."""


@dataclass
class BuildResult:
    """What `build` made, and how long each step took (seconds, by step name)."""

    base: str
    deps: str
    by_source: str
    """The same image as `base`, by the digest of the checkout and python-deps it was built from."""
    timings: dict[str, float] = field(default_factory=dict)


def cache_dir() -> Path:
    """$FAAS_GPU_CACHE, else $XDG_CACHE_HOME/faas-gpu, else ~/.cache/faas-gpu."""
    if os.environ.get("FAAS_GPU_CACHE"):
        return Path(os.environ["FAAS_GPU_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "faas-gpu"


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def requirements(repo: Path = paths.REPO_ROOT) -> list[str]:
    """The image's third-party requirements: pyproject's runtime dependencies, torch, and what the
    editable install of the checkout needs to build."""
    with open(repo / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return [TORCH_REQUIREMENT, *BUILD_REQUIREMENTS, *TARGET_EXTRAS, *project["dependencies"]]


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One builder per cache entry at a time (several test sessions may start cold together).
    Taking the lock marks the entry used (`used`), and prunes the other versions of its kind
    that have not been used for `STALE_AFTER_S` (`prune`)."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".lock-{name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            used(name)
            prune(name)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


STALE_AFTER_S = 7 * 86400.0
"""An entry of the cache no build or test has used for this long, while another version of its
kind is in use, is removed: each dependency change would otherwise leave ~2 GB behind."""

_ENTRY = re.compile(r"^(?P<kind>[a-z0-9-]+?)-(?P<hash>[0-9a-f]{16})(?P<part>\.part[0-9]*)?(?:\.tar)?$")


def used(name: str) -> None:
    """Mark a cache entry used now: its lock file's time is its last use (readers that do not
    take the lock, such as the swarm tests' registry seed, call this)."""
    lock = cache_dir() / f".lock-{name}"
    lock.touch()


def prune(keep: str, now: float | None = None) -> list[str]:
    """Remove the other versions of `keep`'s kind (`wheelhouse-<hash>`, `python-deps-<hash>.tar`,
    `rootfs-<suite>-<hash>.tar`, `registry-<hash>`) and their leftover `.part` files that were
    last used over `STALE_AFTER_S` ago and that no builder holds; returns their names."""
    match = _ENTRY.match(keep)
    if match is None:
        return []
    folder, now = cache_dir(), time.time() if now is None else now
    removed = []
    for entry in sorted(folder.iterdir()):
        other = _ENTRY.match(entry.name)
        if other is None or other["kind"] != match["kind"] or other["hash"] == match["hash"]:
            continue
        whole = entry.name.replace(other["part"] or "", "")  # the entry a part file was becoming
        lock_path = folder / f".lock-{whole}"
        last = lock_path.stat().st_mtime if lock_path.exists() else entry.stat().st_mtime
        if now - last < STALE_AFTER_S:
            continue
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a builder holds it: in use
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            if not other["part"] or not (folder / whole).exists():  # no entry left under this lock
                lock_path.unlink(missing_ok=True)
        removed.append(entry.name)
        _print(f"[base-image] removed {entry.name} from the cache (unused for {(now - last) / 86400:.0f} days)")
    return removed


class Steps:
    """Prints each step and its duration, and keeps the durations for the caller."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str, what: str) -> Iterator[None]:
        self.log(f"[base-image] {what} ...")
        start = time.monotonic()
        yield
        self.timings[name] = round(time.monotonic() - start, 1)
        self.log(f"[base-image] {what}: {self.timings[name]} s")


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rootfs_tar(steps: Steps, given: Path | None = None) -> Path:
    """The Debian root file system: `given`, else the cached mmdebstrap output (made on a miss)."""
    if given is not None:
        if not given.is_file():
            raise BaseImageError(f"no root file system at {given}")
        return given
    target = cache_dir() / f"rootfs-{SUITE}-{_digest(SUITE, *DEBIAN_PACKAGES)}.tar"
    with locked(target.name):
        if target.is_file():
            return target
        if shutil.which("mmdebstrap") is None:
            raise BaseImageError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap), or pass --rootfs")
        include = f"--include={','.join(DEBIAN_PACKAGES)}"
        part = target.with_name(f"{target.stem}.part{os.getpid()}.tar")  # mmdebstrap reads the format off ".tar"
        command = ["mmdebstrap", "--variant=apt", include, SUITE, str(part)]
        sources = Path("/etc/apt/sources.list.d/debian.sources")
        if sources.is_file():  # the mirror (or proxy) this host's own apt uses
            command.append(str(sources))
        with steps.step("mmdebstrap", f"mmdebstrap {SUITE} ({', '.join(DEBIAN_PACKAGES)})"):
            run = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            if run.returncode != 0:
                raise BaseImageError(f"mmdebstrap failed ({run.returncode}): {run.stderr[-2000:]}")
        os.replace(part, target)
    return target


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def wheelhouse(steps: Steps, reqs: list[str]) -> Path:
    """A folder of wheels for `reqs` and their dependencies, filled by the host's pip (its config:
    the local torch wheel, the local indexes) once per requirement list."""
    target = cache_dir() / f"wheelhouse-{_digest(sys.version.split()[0], *reqs)}"
    with locked(target.name):
        if (target / ".complete").is_file():
            return target
        part = Path(str(target) + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        with steps.step("wheelhouse", f"pip wheel {len(reqs)} requirements into {target}"):
            run = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(part), *reqs],
                stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )  # fmt: skip
            if run.returncode != 0:
                raise BaseImageError(f"pip wheel failed ({run.returncode}): {run.stderr[-2000:]}")
        (part / ".complete").write_text("\n".join(reqs) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(part, target)
    return target


def _has_image(client: Any, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _docker_build(client: Any, context: Path, tag: str, log: Callable[[str], None]) -> None:
    """A classic `docker build` of `context` with no network (everything is in the context)."""
    lines: list[str] = []
    for chunk in client.api.build(path=str(context), tag=tag, rm=True, forcerm=True, network_mode="none",
                                  decode=True, timeout=DOCKER_TIMEOUT):  # fmt: skip
        if "error" in chunk:
            raise BaseImageError(f"docker build {tag} failed: {chunk['error'].strip()}\n" + "".join(lines[-30:]))
        text = chunk.get("stream") or ""
        lines.append(text)
        if text.startswith("Step "):
            log(f"[base-image]   {text.strip()}")


def save_image(client: Any, ref: str, target: Path) -> None:
    """`docker save ref > target`, atomically (a half-written tar is never left under the name)."""
    part = Path(str(target) + f".part{os.getpid()}")
    with open(part, "wb") as f:
        for chunk in client.api.get_image(ref, chunk_size=4 << 20):  # named as `ref` (images.save: its first tag)
            f.write(chunk)
    os.replace(part, target)


def load_image(client: Any, tar: Path) -> None:
    """`docker load < tar`."""
    with open(tar, "rb") as f:
        client.images.load(f)


def _rootfs_id(rootfs: Path | None) -> str:
    recipe = f"mmdebstrap:{SUITE}:{','.join(DEBIAN_PACKAGES)}"
    return f"file:{_file_digest(rootfs)}" if rootfs is not None else recipe


def deps_ref(rootfs: Path | None = None, repo: Path = paths.REPO_ROOT) -> str:
    """The python-deps image's name for these inputs (`faas-gpu/python-deps:<hash>`), built or not."""
    return f"{DEPS_REPO}:{_digest(_rootfs_id(rootfs), *requirements(repo), DEPS_DOCKERFILE)}"


def ensure_deps(client: Any, steps: Steps, rootfs: Path | None = None, repo: Path = paths.REPO_ROOT) -> str:
    """`faas-gpu/python-deps:<hash>` in the engine `client` talks to: already there, loaded from the
    cached tar, or built (root file system, wheelhouse, docker build) and then cached. Its name."""
    reqs = requirements(repo)
    rootfs_id = _rootfs_id(rootfs)
    ref = deps_ref(rootfs, repo)
    digest = ref.rsplit(":", 1)[1]
    if _has_image(client, ref):
        steps.log(f"[base-image] {ref} is in the engine already")
        return ref
    cached = cache_dir() / f"python-deps-{digest}.tar"
    with locked(cached.name):
        if cached.is_file():
            with steps.step("deps_load", f"docker load {cached}"):
                load_image(client, cached)
            return ref
        tar = rootfs_tar(steps, rootfs)
        rootfs_ref = f"{ROOTFS_REPO}:{_digest(rootfs_id)}"
        if not _has_image(client, rootfs_ref):
            with steps.step("import", f"docker import {tar.name} as {rootfs_ref}"):
                repository, name_tag = rootfs_ref.split(":")
                with open(tar, "rb") as data:  # a stream: the SDK sends a path string as a URL
                    client.api.import_image(src=data, repository=repository, tag=name_tag)
        wheels = wheelhouse(steps, reqs)
        with tempfile.TemporaryDirectory(prefix="faas-gpu-deps-") as tmp:
            context = Path(tmp)
            shutil.copytree(wheels, context / "wheels", copy_function=_link_or_copy)
            (context / "requirements.txt").write_text("\n".join(reqs) + "\n")
            (context / "Dockerfile").write_text(DEPS_DOCKERFILE.format(rootfs=rootfs_ref, venv=VENV, digest=digest))
            with steps.step("deps_build", f"docker build {ref}"):
                _docker_build(client, context, ref, steps.log)
        with steps.step("deps_save", f"docker save {ref} > {cached}"):
            save_image(client, ref, cached)
    return ref


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def source_files(repo: Path = paths.REPO_ROOT) -> list[Path]:
    """The checkout's files, relative to it: git's tracked and untracked-but-not-ignored files in a
    git work tree (what a fresh clone plus one's edits has), else the tree without build and state
    folders."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True, check=True, stdin=subprocess.DEVNULL,
        ).stdout  # fmt: skip
        names = [Path(n) for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for folder, dirs, files in os.walk(repo):
            dirs[:] = [d for d in dirs if d not in SKIP_PARTS and not d.endswith(".egg-info")]
            names += [Path(folder, f).relative_to(repo) for f in files if not f.endswith(".pyc")]
    return sorted(n for n in names if (repo / n).is_file() or (repo / n).is_symlink())


def source_digest(repo: Path = paths.REPO_ROOT, files: list[Path] | None = None) -> str:
    h = hashlib.sha256()
    for name in files if files is not None else source_files(repo):
        h.update(str(name).encode() + b"\0")
        path = repo / name
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def build(
    client: Any,
    *,
    rootfs: Path | None = None,
    tag: str = BASE_IMAGE,
    repo: Path = paths.REPO_ROOT,
    log: Callable[[str], None] = _print,
) -> BuildResult:
    """Make `tag` (default faas-gpu/base:latest) in the engine `client` talks to, python-deps first.

    The base is tagged `faas-gpu/base:<source digest>` too; when the engine has that tag already,
    only `tag` is (re)pointed at it."""
    steps = Steps(log)
    total = time.monotonic()
    deps = ensure_deps(client, steps, rootfs, repo)
    files = source_files(repo)
    digest = source_digest(repo, files)
    by_source = f"{BASE_REPO}:{_digest(deps, digest, BASE_DOCKERFILE)}"
    if not _has_image(client, by_source):
        with tempfile.TemporaryDirectory(prefix="faas-gpu-base-") as tmp:
            context = Path(tmp)
            for name in files:
                (context / "src" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(repo / name, context / "src" / name, follow_symlinks=False)
            (context / "Dockerfile").write_text(BASE_DOCKERFILE.format(deps=deps, src=SOURCE_DIR, digest=digest))
            with steps.step("base_build", f"docker build {by_source} ({len(files)} files of {repo})"):
                _docker_build(client, context, by_source, log)
    client.images.get(by_source).tag(*tag.rsplit(":", 1))
    steps.timings["total"] = round(time.monotonic() - total, 1)
    log(f"[base-image] {tag} ready ({by_source}, from {deps}) in {steps.timings['total']} s")
    return BuildResult(base=tag, deps=deps, by_source=by_source, timings=steps.timings)


def client_for(docker_host: str | None = None) -> Any:
    """A docker SDK client for `docker_host` (unix:///..., tcp://...), else $DOCKER_HOST / the default
    socket; long timeouts for image loads and saves."""
    import docker

    if docker_host:
        return docker.DockerClient(base_url=docker_host, timeout=DOCKER_TIMEOUT)
    return docker.from_env(timeout=DOCKER_TIMEOUT)
