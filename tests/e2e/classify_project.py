"""A project folder holding the classify example and a stack file, as a user's would be.

The whole-stack tests each deploy classify with their own image name, annotations and
environment; the folder and the stack file around it are the same, so they are made here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from faas_gpu.paths import REPO_ROOT


def classify_stack(image: str, annotations: dict[str, str], environment: dict[str, str] | None = None) -> dict:
    """The stack file (as a dict) deploying ./classify with python3-gpu."""
    fn: dict = {"lang": "python3-gpu", "handler": "./classify", "image": image, "annotations": annotations}
    if environment:
        fn["environment"] = environment
    return {"version": 1.0, "provider": {"name": "openfaas"}, "functions": {"classify": fn}}


def add_function(root: Path, stack_file: dict, name: str, handler: str, image: str) -> None:
    """A second python3-gpu function beside classify: its own folder under `root` with
    classify's model.py and the given handler source, and its entry in `stack_file`."""
    folder = root / name
    folder.mkdir()
    shutil.copy(REPO_ROOT / "functions" / "classify" / "model.py", folder / "model.py")
    (folder / "handler.py").write_text(handler)
    stack_file["functions"][name] = {"lang": "python3-gpu", "handler": f"./{name}", "image": image}


def write_project(root: Path, stack_file: dict, name: str = "stack.yml") -> Path:
    """Copy the classify example (without weights: the handler makes them) into `root` and write
    `stack_file` beside it; the stack file's path."""
    if not (root / "classify").exists():
        shutil.copytree(REPO_ROOT / "functions" / "classify", root / "classify", ignore=shutil.ignore_patterns("*.pt"))
    path = root / name
    path.write_text(yaml.safe_dump(stack_file))
    return path


def build_and_deploy(root: Path, home: Path, gateway: str) -> None:
    """`faas-gpu build` then `faas-gpu deploy` of `root`/stack.yml, as a user runs them in the
    project folder, with `home` as the state folder and `gateway` as the stack to deploy to."""
    env = {**os.environ, "FAAS_GPU_HOME": str(home)}
    for cmd in (["build", "-f", "stack.yml"], ["deploy", "-f", "stack.yml", "--gateway", gateway]):
        done = subprocess.run(
            [sys.executable, "-m", "faas_gpu.cli", *cmd], cwd=root, env=env, capture_output=True, timeout=300
        )
        assert done.returncode == 0, (cmd, done.stdout.decode()[-2000:], done.stderr.decode()[-2000:])
