"""The local image store: what `faas-gpu build` makes and the local runtime runs.

An image is a folder named after the image: the build context (`context/`, what `faas-cli
build --shrinkwrap` writes to build/<fn>/) and a virtual environment (`venv/`). The venv reuses
the stack's own site-packages through a .pth file, so torch is installed once per machine, not
once per function; pip then installs only what that does not already satisfy.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from faas_gpu import paths

RECORD = "image.json"


class BuildError(Exception):
    pass


def normalise(image: str) -> str:
    """Docker's rule: a name without a tag means `:latest`."""
    image = image.strip()
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else f"{image}:latest"


def folder_name(image: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", normalise(image))


@dataclass(frozen=True)
class ImageRecord:
    image: str
    folder: str
    lang: str
    fprocess: str
    created: float

    @property
    def context(self) -> Path:
        return Path(self.folder) / "context"

    @property
    def python(self) -> Path:
        return Path(self.folder) / "venv" / "bin" / "python"


def _requirements(path: Path) -> bool:
    if not path.is_file():
        return False
    return any(line.strip() and not line.strip().startswith("#") for line in path.read_text().splitlines())


class ImageStore:
    def __init__(self, root: Path | None = None):
        self.root = root or paths.images_dir()

    def get(self, image: str) -> ImageRecord | None:
        record = self.root / folder_name(image) / RECORD
        try:
            return ImageRecord(**json.loads(record.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def list(self) -> list[ImageRecord]:
        if not self.root.exists():
            return []
        return [r for r in (self.get_folder(p) for p in sorted(self.root.iterdir())) if r]

    def get_folder(self, folder: Path) -> ImageRecord | None:
        try:
            return ImageRecord(**json.loads((folder / RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def remove(self, image: str) -> bool:
        folder = self.root / folder_name(image)
        if not folder.exists():
            return False
        shutil.rmtree(folder)
        return True

    def add(self, image: str, context_dir: Path, *, lang: str, fprocess: str, quiet: bool = True) -> ImageRecord:
        """Copy the build context in, make its environment, then swap it in atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / folder_name(image)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=self.root))
        try:
            shutil.copytree(context_dir, staging / "context", symlinks=True)
            _make_venv(staging / "venv")
            for req in (
                staging / "context" / "requirements.txt",
                staging / "context" / "function" / "requirements.txt",
            ):
                if _requirements(req):
                    _pip_install(staging / "venv" / "bin" / "python", req, quiet)
            record = ImageRecord(normalise(image), str(final), lang, fprocess, time.time())
            (staging / RECORD).write_text(json.dumps(asdict(record), indent=2))
            # the venv's scripts name their folder: rewrite it to the final place before the swap
            _relocate_venv(staging / "venv", final / "venv")
            old = None
            if final.exists():
                old = final.with_name(f".{final.name}.old-{time.time_ns()}")
                final.rename(old)
            staging.rename(final)
            if old:
                shutil.rmtree(old, ignore_errors=True)
            return record
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _make_venv(target: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = next(target.glob("lib/python*/site-packages"))
    stack_site = sysconfig.get_paths()["purelib"]
    platlib = sysconfig.get_paths()["platlib"]
    lines = dict.fromkeys([stack_site, platlib])
    (site / "_faas_gpu_stack.pth").write_text("\n".join(lines) + "\n")


def _pip_install(python: Path, requirements: Path, quiet: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "-r", str(requirements)]
    if quiet:
        cmd.append("-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BuildError(f"pip install -r {requirements.name} failed:\n{tail}")


def _relocate_venv(venv: Path, final: Path) -> None:
    old = str(venv)
    for f in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
        if f.is_file() and not f.is_symlink():
            try:
                text = f.read_text()
            except UnicodeDecodeError:
                continue
            if old in text:
                f.write_text(text.replace(old, str(final)))
