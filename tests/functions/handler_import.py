"""A function's handler imported as the template does, and the event the template hands it.

The handler folder is copied to <root>/function/ and imported as the package `function`, so its
relative imports resolve exactly as in `build/<fn>/function/` under the template's index.py.
Shared by the examples' tests.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

from werkzeug.datastructures import Headers

from faas_gpu.paths import REPO_ROOT

FUNCTIONS = REPO_ROOT / "functions"


class Event:
    def __init__(self, body: bytes = b"", headers: dict | None = None, method: str = "POST", path: str = "/"):
        self.body = body
        self.headers = Headers(headers or {})
        self.method = method
        self.query = {}
        self.path = path


def load_handler(name: str, root: Path, src: Path | None = None) -> ModuleType:
    """Copy functions/<name> (without weights) or `src` (as is) to root/function; import function.handler."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pt") if src is None else shutil.ignore_patterns("__pycache__")
    shutil.copytree(src or FUNCTIONS / name, root / "function", ignore=ignore, copy_function=shutil.copy2)
    for mod in [m for m in sys.modules if m == "function" or m.startswith("function.")]:
        del sys.modules[mod]
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("function.handler")
    finally:
        sys.path.remove(str(root))
