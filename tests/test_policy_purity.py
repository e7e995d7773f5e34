"""Policies are pure: no clock, no sleeping, no I/O, no daemons (DESIGN principle 1).

Checked on the source (AST) of every module of faas_gpu.policies.
"""

import ast
from pathlib import Path

import pytest

import faas_gpu.policies as policies

FORBIDDEN_MODULES = {
    "time",
    "datetime",
    "socket",
    "requests",
    "urllib3",
    "http",
    "flask",
    "redis",
    "pyetcd",
    "sqlite3",
    "subprocess",
    "threading",
    "asyncio",
    "os",
    "random",
    "provider",
    "gpu_manager",
    "faas_gpu.datastore",
    "faas_gpu.async_queue",
    "simpy",
}
MODULES = sorted(Path(policies.__file__).parent.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(Path(policies.__file__).parent)))
def test_policy_module_imports_nothing_impure(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        for name in names:
            root = name.split(".")[0]
            assert root not in FORBIDDEN_MODULES and name not in FORBIDDEN_MODULES, f"{path.name} imports {name}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"open", "print", "input"}, f"{path.name} calls {node.func.id}()"


def test_the_simulator_drives_the_same_policy_objects():
    from faas_gpu.sim import engine

    assert engine.make_scheduler is policies.make_scheduler


def test_the_scheduler_daemon_drives_them_too():
    from scheduler import units

    assert units.make_scheduler is policies.make_scheduler
    assert units.ModelCache is policies.ModelCache
