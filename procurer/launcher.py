"""One local process per node (`--launch CMD`), standing in for the node's VM.

Kept apart from the loop so that a real cloud's back end, which boots VMs itself, simply passes
no launcher.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

from faas_gpu.ports import free_port


class Launcher:
    """One local process per node (e.g. a GPU Manager with `--node {node}`), standing in for its VM."""

    def __init__(self, template: str, log_dir: Path):
        self.template, self.log_dir = template, log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, node: str) -> None:
        argv = shlex.split(self.template.format(node=node, port=free_port()))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{node}.log", "ab") as out:
            self.procs[node] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, node: str) -> None:
        proc = self.procs.pop(node, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
