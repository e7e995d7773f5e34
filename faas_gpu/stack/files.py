"""Where stack files are and the one rule for every path they name.

Kept apart from the schema so that `faas_gpu.build` (which copies handlers and build secrets)
checks paths with the same `resolve_inside` the parser uses, without the YAML machinery.
"""

from __future__ import annotations

import os
from pathlib import Path

from .text import StackError


def find_stack_file(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> Path | None:
    """faas-cli's default: ./stack.yaml, else ./stack.yml; an explicit -f wins."""
    if explicit:
        return Path(explicit)
    cwd = cwd or Path.cwd()
    for name in ("stack.yaml", "stack.yml"):
        if (cwd / name).is_file():
            return cwd / name
    return None


def resolve_inside(stack_dir: Path, value: str, where: str) -> Path:
    """`value` (relative to the stack file's folder, or absolute) resolved, links followed; a
    StackError naming `where` when it lies outside that folder.

    The one rule for every path a stack file names (handler, environment_file, build_secrets,
    configuration.copy): `handler: ../../../../etc` once copied /etc into build/, and an
    `environment_file: [/etc/shadow]` error quoted the file's first line.
    """
    root = Path(stack_dir).resolve()
    target = (root / value).resolve()
    if not target.is_relative_to(root):
        raise StackError(f"{where}: {value!r} is outside the stack file's folder ({root}); paths must stay inside it")
    return target


def display_name(path: Path) -> str:
    """The file as a user would name it: relative to the working folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name
