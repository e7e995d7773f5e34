"""The local image store: what `faas-gpu build` makes and the local runtime runs.

Layout under `paths.images_dir()`:

    <safe-name>            -> symlink to the current version, e.g. `.<safe-name>@<ns>`
    .<safe-name>@<ns>/     one built version: image.json, context/ (the shrink-wrapped build
                           context), venv/ (the function environment)
    .tmp-*                 a build in progress

A build is made in a temporary folder and published by atomically replacing the symlink, so a
concurrent reader (a deploy) sees the old image or the new one, never half of one. A running
instance keeps the folder it was started from; the previous version is kept, older ones go.

The function environment is a venv made with the running interpreter plus a `.pth` file that puts
the stack environment's site-packages on its path: torch, flask, waitress and prometheus_client
are reused, not copied. pip then installs only what that does not already satisfy.

Each version records the content hash of what it was built from (`build_inputs`: the build
context's files, the lang and fprocess, the interpreter and the stack packages its environment is
made of), so a build whose inputs have not changed can be skipped (`up_to_date`): `faas-gpu up`
on an unchanged stack rebuilds nothing and runs no pip, so it starts offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from faas_gpu import paths

RECORD = "image.json"
PTH_NAME = "_faas_gpu_stack.pth"
KEEP_VERSIONS = 2  # the current one and the one before it

StepCallback = Callable[[str, int], None]
"""`on_step(label, total)`: a build step named `label` begins, of `total` steps as now known. Why a
callback: the store says what it is doing and the CLI decides how to show it (a bar on a terminal)."""


class BuildError(Exception):
    """A function that cannot be built; the message says why (pip's tail for install failures)."""


def normalise(image: str) -> str:
    """Docker's rule: a name without a tag or digest means `:latest` (`fn` == `fn:latest`)."""
    image = image.strip()
    if not image:
        raise BuildError("image: an image name is required")
    last = image.rsplit("/", 1)[-1]
    return image if (":" in last or "@" in image) else f"{image}:latest"


def folder_name(image: str) -> str:
    """A safe folder name for an image (`ghcr.io/me/fn:1.0` -> `ghcr.io_me_fn_1.0`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", normalise(image))
    return name.lstrip(".") or "_"


@dataclass(frozen=True)
class ImageRecord:
    image: str  # normalised name
    folder: Path  # this version's folder
    context: Path  # the build context copied in (build/<fn>/ of `faas-cli build --shrinkwrap`)
    python: Path  # the function environment's interpreter
    fprocess: str
    lang: str
    created: float  # time.time() of the build
    inputs: str = ""
    """The content hash of its build inputs (`build_inputs`); "" for a version built before it was kept."""

    def to_json(self) -> dict:
        out = {"image": self.image, "fprocess": self.fprocess, "lang": self.lang, "created": self.created}
        if self.inputs:
            out["inputs"] = self.inputs
        return out

    @classmethod
    def read(cls, folder: Path) -> ImageRecord | None:
        try:
            data = json.loads((folder / RECORD).read_text())
            return cls(
                image=data["image"],
                folder=folder,
                context=folder / "context",
                python=folder / "venv" / "bin" / "python",
                fprocess=data["fprocess"],
                lang=data.get("lang", ""),
                created=float(data["created"]),
                inputs=str(data.get("inputs") or ""),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def has_requirements(path: Path) -> bool:
    """True if a requirements file has any line that is not blank or a comment."""
    if not path.is_file():
        return False
    return any(line.strip() and not line.strip().startswith("#") for line in path.read_text().splitlines())


def stack_site_packages() -> list[str]:
    """The running environment's site-packages (what the function venv reuses through the .pth)."""
    found = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    found += [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    return list(dict.fromkeys(os.path.realpath(p) for p in found))


def build_inputs(context: Path, *, lang: str, fprocess: str) -> str:
    """The content hash of what an image is built from: every file of the build context (its path,
    whether it is executable, its bytes; a link's target), the lang and fprocess, and the
    interpreter and stack packages its environment is made from (a new Python, or another stack
    environment, makes a new environment). Names and bytes only, never times: a shrink-wrap
    written again with the same files hashes the same."""
    digest = hashlib.sha256()
    python = os.path.realpath(sys.executable)
    header = {"lang": lang, "fprocess": fprocess, "python": [python, sys.version], "site": stack_site_packages()}
    digest.update(json.dumps(header, sort_keys=True).encode() + b"\0")
    for folder, dirs, files in os.walk(context):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not os.path.islink(os.path.join(folder, d)))
        links = [d for d in os.listdir(folder) if os.path.islink(os.path.join(folder, d))]
        for name in sorted(set(files) | set(links)):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, context).encode("utf-8", "surrogateescape")
            if os.path.islink(path):
                digest.update(b"L" + rel + b"\0" + os.readlink(path).encode("utf-8", "surrogateescape") + b"\0")
                continue
            executable = b"x" if os.access(path, os.X_OK) else b"-"
            digest.update(b"F" + executable + rel + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
    return digest.hexdigest()


class ImageStore:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else paths.images_dir()

    # -- reading -------------------------------------------------------------------------
    def get(self, image: str) -> ImageRecord | None:
        link = self.root / folder_name(image)
        try:
            folder = link.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        return ImageRecord.read(folder)

    def up_to_date(self, image: str, inputs: str) -> ImageRecord | None:
        """The current version of `image` when it was built from exactly `inputs` and its
        environment is still whole; None when a build is needed."""
        record = self.get(image)
        if record is None or not inputs or record.inputs != inputs:
            return None
        if not record.python.exists() or not record.context.is_dir():
            return None
        return record

    def list(self) -> list[ImageRecord]:
        if not self.root.is_dir():
            return []
        records = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):
                continue
            try:
                record = ImageRecord.read(entry.resolve(strict=True))
            except (OSError, RuntimeError):
                continue
            if record:
                records.append(record)
        return records

    # -- writing -------------------------------------------------------------------------
    def remove(self, image: str) -> bool:
        name = folder_name(image)
        link = self.root / name
        if not link.is_symlink() and not link.exists():
            return False
        if link.is_symlink():
            link.unlink()
        else:
            shutil.rmtree(link, ignore_errors=True)
        for old in self._versions(name):
            shutil.rmtree(old, ignore_errors=True)
        return True

    def add(
        self,
        image: str,
        context_dir: Path | str,
        *,
        lang: str,
        fprocess: str,
        quiet: bool = True,
        on_step: StepCallback | None = None,
        inputs: str | None = None,
    ) -> ImageRecord:
        """Copy the build context in, make its environment, then publish it atomically, with the
        content hash of its inputs (`inputs`, computed here when not given)."""
        context_dir = Path(context_dir)
        if not context_dir.is_dir():
            raise BuildError(f"image {image}: build context {context_dir} is not a folder")
        if inputs is None:
            inputs = build_inputs(context_dir, lang=lang, fprocess=fprocess)
        handler_folder = _handler_folder(context_dir)
        candidates = ("requirements.txt", f"{handler_folder}/requirements.txt")
        requirements = [rel for rel in candidates if has_requirements(context_dir / rel)]
        labels = ["copy the context", "make the function environment"]
        labels += [f"pip install -r {rel}" for rel in requirements] + ["publish"]

        def step(label: str) -> None:
            if on_step is not None:
                on_step(label, len(labels))

        image = normalise(image)
        name = folder_name(image)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        version = self.root / f".{name}@{time.time_ns()}"
        try:
            step(labels[0])
            shutil.copytree(
                context_dir, staging / "context", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
            step(labels[1])
            make_function_env(staging / "venv")
            for rel in requirements:
                step(f"pip install -r {rel}")
                pip_install(staging / "venv" / "bin" / "python", staging / "context" / rel, quiet=quiet)
            step(labels[-1])
            created = time.time()
            record_json = {"image": image, "fprocess": fprocess, "lang": lang, "created": created, "inputs": inputs}
            (staging / RECORD).write_text(json.dumps(record_json, indent=2) + "\n")
            _relocate_venv(staging / "venv", version / "venv")
            paths.make_tree_private(staging)  # the copied context kept the build folder's 0644s
            staging.rename(version)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._publish(name, version)
        record = ImageRecord.read(version)
        assert record is not None
        return record

    def _publish(self, name: str, version: Path) -> None:
        link = self.root / name
        tmp_link = self.root / f".tmp-link-{name}-{os.getpid()}-{time.time_ns()}"
        tmp_link.symlink_to(version.name)
        if link.exists() and not link.is_symlink():  # a store written before versioned folders
            legacy = self.root / f".{name}@legacy-{time.time_ns()}"
            link.rename(legacy)
        os.replace(tmp_link, link)  # atomic: readers see the old version or the new one
        current = version.name
        older = [v for v in self._versions(name) if v.name != current]
        for old in older[: max(0, len(older) - (KEEP_VERSIONS - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def _versions(self, name: str) -> list[Path]:
        """This image's version folders, oldest first."""
        prefix = f".{name}@"
        found = [p for p in self.root.iterdir() if p.name.startswith(prefix) and p.is_dir()]

        def stamp(p: Path) -> int:
            suffix = p.name[len(prefix) :]
            return int(suffix) if suffix.isdigit() else 0

        return sorted(found, key=stamp)


def _handler_folder(context: Path) -> str:
    try:
        data = yaml.safe_load((context / "template.yml").read_text()) or {}
        folder = data.get("handler_folder") if isinstance(data, dict) else None
    except (OSError, yaml.YAMLError):
        folder = None
    return str(folder or "function")


def make_function_env(target: Path) -> Path:
    """A venv of the running interpreter whose .pth exposes the stack's site-packages; returns its python."""
    proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"cannot create the function environment: {_tail(proc.stdout + proc.stderr)}")
    sites = sorted(target.glob("lib/python*/site-packages"))
    if not sites:
        raise BuildError(f"cannot create the function environment: no site-packages in {target}")
    # addsitedir (not a bare path) so that the stack's own .pth files run too: its editable install
    # of faas-gpu is what lets the template import the GPU client
    lines = [f"import site; site.addsitedir({d!r})" for d in stack_site_packages()]
    (sites[0] / PTH_NAME).write_text("\n".join(lines) + "\n")
    return target / "bin" / "python"


def pip_install(python: Path, requirements: Path, *, quiet: bool = True, timeout_s: float = 1800) -> None:
    """`pip --python <venv python> install -r <file>`: pip sees the .pth packages and skips those."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--disable-pip-version-check",
        "-r",
        str(requirements),
    ]
    if quiet:
        cmd.append("-q")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BuildError(f"pip install -r {requirements.name} did not finish within {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        where = f"{requirements.parent.name}/{requirements.name}"
        raise BuildError(f"pip install -r {where} failed:\n{_tail(proc.stdout + proc.stderr)}")


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _relocate_venv(venv: Path, final: Path) -> None:
    """The activate scripts name their folder: point them at the folder the venv is published in."""
    old = str(venv)
    for f in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
        if f.is_file() and not f.is_symlink():
            try:
                text = f.read_text()
            except UnicodeDecodeError:
                continue
            if old in text:
                f.write_text(text.replace(old, str(final)))
