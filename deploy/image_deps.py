"""The project's dependencies that the image's Python lacks, one requirement a line (stdlib only).

Why: deploy/Dockerfile builds on `python:3.11-slim` for users on the internet, where pip installs
everything, and on `faas-gpu/base` (Debian's Python with a venv holding every dependency, torch
included), where nothing can be downloaded. Asking pip to install a satisfied requirement still
asks an index, so the Dockerfile asks this script first and runs pip only for what is missing.
Presence is what counts, not the version: the base image is rebuilt when pyproject.toml changes.

    python deploy/image_deps.py pyproject.toml [extra ...]
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies and those of `extras`, as written in pyproject.toml."""
    project = tomllib.loads(pyproject.read_text())["project"]
    out = list(project.get("dependencies", []))
    for extra in extras:
        out += project.get("optional-dependencies", {}).get(extra, [])
    return out


def missing(reqs: list[str]) -> list[str]:
    """The requirements whose distribution is not installed (markers and versions not judged)."""
    out = []
    for req in reqs:
        match = _NAME.match(req)
        if match is None:
            continue
        try:
            importlib.metadata.version(match.group(1))
        except importlib.metadata.PackageNotFoundError:
            out.append(req)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for req in missing(requirements(Path(argv[0]), argv[1:])):
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
