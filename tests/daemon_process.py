"""A real faas-gpu daemon process for tests (`python -m scheduler`, `python -m gpu_manager`): one
module on a free loopback port with the state folder it is given, killed as a process group.

Shared by the scheduler, client and end-to-end tests and by the GPU-path benchmarks, which start
the same daemons the way `faas-gpu up` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import requests

from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port


class Daemon:
    def __init__(self, module: str, home, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / f"{module}-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--home", str(home), "--port", str(self.port), *args],
            cwd=REPO_ROOT,
            stdout=open(self.log, "wb"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True,
        )
        for _ in range(200):
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError(self.log.read_text()[-3000:])

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)


def wait_units(sched_url, auth, n, timeout_s=20):
    """The scheduler's status once it sees `n` units and a leader (units report asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = requests.get(f"{sched_url}/v1/status", headers=auth, timeout=5).json()
        if len(st["units"]) >= n and st["leader"]:
            return st
        time.sleep(0.2)
    raise AssertionError(st)
