"""Policies are pure: no clock, no sleeping, no I/O, no daemons (DESIGN principle 1).

Checked on the source (AST) of every module of faas_gpu.policies: what it imports, and what it
reads. Data (coefficients, profile tables, assumptions, traces) comes in as arguments; the files
are read by loaders outside `policies/` (`faas_gpu.policy_data`, `faas_gpu.sim`, `faas_gpu.profiling`).
`lint-imports` (pyproject.toml, `[tool.importlinter]`) checks the import half of this again, on
the whole import graph; this test also sees the calls that read a file, a resource, the
environment or a clock through a module that is allowed (numpy, io, ...), and checks the checker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import faas_gpu.policies as policies

ROOT = Path(policies.__file__).parent
PACKAGE = policies.__name__
MODULES = sorted(ROOT.rglob("*.py"))

# Imported at all, these mean I/O, a clock, randomness, concurrency or a file format: the
# policies take parsed data and the time `now` as arguments instead.
FORBIDDEN_MODULES = {
    "time",
    "datetime",
    "socket",
    "requests",
    "urllib",
    "urllib3",
    "http",
    "flask",
    "werkzeug",
    "redis",
    "pyetcd",
    "etcd3",
    "docker",
    "pynvml",
    "sqlite3",
    "subprocess",
    "threading",
    "multiprocessing",
    "concurrent",
    "asyncio",
    "signal",
    "os",
    "sys",
    "random",
    "secrets",
    "uuid",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "importlib",
    "pkgutil",
    "pickle",
    "shelve",
    "json",
    "yaml",
    "tomllib",
    "configparser",
    "torch",
    "simpy",
    "logging",
}
# Ours: the daemons, and every part of faas_gpu but the policies and the contract (ground floor).
DAEMONS = {"provider", "scheduler", "gpu_manager", "procurer"}
ALLOWED_OURS = ("faas_gpu.policies", "faas_gpu.contract")
# Reached through a module the policies may use (numpy, io, builtins): reads, writes, clocks.
FORBIDDEN_ATTRIBUTES = {
    "numpy.load",
    "numpy.loadtxt",
    "numpy.genfromtxt",
    "numpy.fromfile",
    "numpy.memmap",
    "numpy.save",
    "numpy.savez",
    "numpy.savetxt",
    "numpy.random",
    "io.open",
    "io.FileIO",
    "builtins.open",
}
ALLOWED_ATTRIBUTES = {"numpy.random.Generator"}  # the type of a generator handed in as an argument
# Path/file methods, whatever the object: policies hold no paths and no open files.
FILE_METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "open",
    "iterdir",
    "glob",
    "rglob",
    "exists",
    "is_file",
    "is_dir",
    "stat",
    "mkdir",
    "unlink",
    "readline",
    "readlines",
}
FORBIDDEN_NAMES = {"open", "print", "input", "exec", "eval", "compile", "__import__", "breakpoint", "__file__"}


def _module_name(path: Path, root: Path = ROOT, package: str = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module of `from ... import`, relative levels resolved against `module`."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _forbidden_import(name: str) -> bool:
    root = name.split(".")[0]
    if root in FORBIDDEN_MODULES or root in DAEMONS:
        return True
    if root == "faas_gpu":
        return not any(name == a or name.startswith(a + ".") for a in ALLOWED_OURS) and name != "faas_gpu"
    return False


def _forbidden_attribute(dotted: str) -> bool:
    if dotted in ALLOWED_ATTRIBUTES:
        return False
    return any(dotted == f or dotted.startswith(f + ".") for f in FORBIDDEN_ATTRIBUTES)


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """`np.load` -> "numpy.load" with the module's import aliases; None when the root is not a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def impurities(source: str, module: str = f"{PACKAGE}.example", is_package: bool = False) -> list[str]:
    """What in `source` (a module of the policies) reads, writes, imports I/O or a daemon: `line: why`."""
    tree = ast.parse(source)
    found: list[str] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _forbidden_import(a.name):
                    found.append(f"{node.lineno}: imports {a.name}")
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for a in node.names:
                full = f"{base}.{a.name}" if base else a.name
                if (
                    _forbidden_import(base)
                    or (base == "faas_gpu" and _forbidden_import(full))
                    or _forbidden_attribute(full)
                ):
                    found.append(f"{node.lineno}: imports {full}")
                aliases[a.asname or a.name] = full
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a.b of a.b.c
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node, aliases) if id(node) not in inner else None
            if dotted and _forbidden_attribute(dotted):
                found.append(f"{node.lineno}: uses {dotted}")
            elif isinstance(node.ctx, ast.Load) and node.attr in FILE_METHODS:
                found.append(f"{node.lineno}: calls .{node.attr}()")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            target = aliases.get(node.id, node.id)
            if node.id in FORBIDDEN_NAMES and node.id not in aliases:
                found.append(f"{node.lineno}: uses {node.id}")
            elif id(node) not in inner and _forbidden_attribute(target):
                found.append(f"{node.lineno}: uses {target}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_policy_module_reads_nothing_and_imports_nothing_impure(path):
    found = impurities(path.read_text(), _module_name(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


def test_policies_ship_no_data_files():
    """Data files beside the policies invite reading them from inside; they live with their loaders."""
    data = [p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file() and p.suffix not in {".py", ".pyc"}]
    assert not data, f"data files in faas_gpu/policies: {data} (move them beside their loader: faas_gpu/policy_data)"


CAUGHT = {
    "a path's text": "from pathlib import Path\ndef f(p):\n    return Path(p).read_text()\n",
    "a file read on any object": "def f(p):\n    return p.read_bytes()\n",
    "a file opened": "def f(p):\n    with open(p) as fh:\n        return fh\n",
    "a file opened through io": "import io\ndef f(p):\n    return io.open(p)\n",
    "a package resource": "from importlib import resources\nX = resources.files(__package__)\n",
    "importlib.resources by its full name": "import importlib.resources\n",
    "json from a file": "import json\ndef f(fh):\n    return json.load(fh)\n",
    "yaml from a file": "import yaml\ndef f(fh):\n    return yaml.safe_load(fh)\n",
    "numpy's loader": "import numpy as np\ndef f(p):\n    return np.load(p)\n",
    "numpy's loader imported by name": "from numpy import loadtxt\ndef f(p):\n    return loadtxt(p)\n",
    "numpy's hidden random state": "import numpy\nX = numpy.random.default_rng()\n",
    "torch's loader": "import torch\ndef f(p):\n    return torch.load(p)\n",
    "the environment": "import os\nX = os.environ.get('FAAS_GPU_MAX_BATCH')\n",
    "the environment by getenv": "from os import getenv\nX = getenv('X')\n",
    "the wall clock": "import time\ndef f():\n    return time.time()\n",
    "the monotonic clock": "from time import monotonic\ndef f():\n    return monotonic()\n",
    "today's date": "import datetime\nX = datetime.datetime.now()\n",
    "a function-level import": "def f():\n    import subprocess\n",
    "the module's own file": "X = __file__\n",
    "a daemon": "from scheduler.core import Scheduler\n",
    "the procurement daemon": "import procurer\n",
    "the datastore": "from faas_gpu.datastore import Datastore\n",
    "the datastore by a relative import": "from ...datastore import Datastore\n",
    "the machine's paths": "from faas_gpu import paths\n",
    "a loader": "from faas_gpu.policy_data.protean import default_assumptions\n",
    "printing": "print('x')\n",
}
PURE = {
    "sibling policies": "from .mig import GpuModel\nfrom faas_gpu.policies.harmony import plan\n",
    "the contract": "from faas_gpu.contract import headers\n",
    "numpy arithmetic": "import numpy as np\nX = np.exp(np.arange(3))\n",
    "a generator passed in": "import numpy as np\ndef f(rng: np.random.Generator):\n    return rng.random()\n",
    "text parsed in memory": "import csv, io\ndef f(text):\n    return list(csv.DictReader(io.StringIO(text)))\n",
    "a regular expression": "import re\nX = re.compile('a+')\n",
    "a dict's get": "def f(d):\n    return d.get('open')\n",
}


@pytest.mark.parametrize("source", CAUGHT.values(), ids=CAUGHT.keys())
def test_the_check_catches(source):
    assert impurities(source, f"{PACKAGE}.protean.example"), source


@pytest.mark.parametrize("source", PURE.values(), ids=PURE.keys())
def test_the_check_lets_pure_code_through(source):
    assert impurities(source, f"{PACKAGE}.protean.example") == []


def test_the_simulator_drives_the_same_policy_objects():
    from faas_gpu.sim import engine

    assert engine.make_scheduler is policies.make_scheduler


def test_the_scheduler_daemon_drives_them_too():
    from scheduler import units

    assert units.make_scheduler is policies.make_scheduler
    assert units.ModelCache is policies.ModelCache
