"""Loading a script that is not in an importable package (a benchmark, a template's copy of a
module, a deploy helper) as a module, for tests of what it defines."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


def _module(name: str, path: Path) -> tuple[ModuleType, Callable[[], None]]:
    """A new module for `path` and what runs its code into it."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    return module, lambda: loader.exec_module(module)


def load(name: str, path: Path) -> ModuleType:
    """The file at `path`, run as a fresh module called `name` (not kept in `sys.modules`)."""
    module, run = _module(name, path)
    run()
    return module


@contextmanager
def registered(name: str, path: Path) -> Iterator[ModuleType]:
    """`load`, with the module in `sys.modules` under `name` while the block runs: a module whose
    dataclasses resolve their annotations through it (or that pickles its own objects) needs it."""
    module, run = _module(name, path)
    sys.modules[name] = module
    try:
        run()
        yield module
    finally:
        sys.modules.pop(name, None)
