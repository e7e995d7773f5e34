"""One CUDA MPS control daemon for the length of a measurement, with pipe and log folders of its own.

Co-located processes on one GPU share its SMs only through MPS; without a daemon they time-slice,
and a co-location curve measured that way is serial (the FBR fit refuses it). The daemon here is
started with `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` under a temporary folder of its
own, so it never meets the system's default daemon (/tmp/nvidia-mps) nor the GPU Manager's, and
`client_env()` is what every process of the run needs to join it. It is stopped (`quit`, then
`quit -t`) when the `with` block ends, however it ends. It changes nothing else on the device
(compute mode, clocks, MIG): a GPU in EXCLUSIVE_PROCESS mode is the administrator's choice.

Every command goes through one runner so that tests fake at the subprocess boundary. (The GPU
Manager has its own per-unit daemons, gpu_manager/mps.py; core code may not import it.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

CONTROL = "nvidia-cuda-mps-control"
# argv, environment, stdin -> (exit status, stdout + stderr)
Runner = Callable[[list[str], dict[str, str], str | None], tuple[int, str]]


class MPSError(RuntimeError):
    """The daemon did not start or stop; the message says why and where its log is."""


def subprocess_runner(argv: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise MPSError(f"{argv[0]} is not installed (it comes with the NVIDIA driver)") from None
    except subprocess.TimeoutExpired:
        raise MPSError(f"{' '.join(argv)} did not finish within 60 s") from None
    return done.returncode, (done.stdout + done.stderr).strip()


class MPSSession:
    """`with MPSSession(device) as mps:` a daemon for `device` (a GPU/MIG UUID or index; None: the
    devices this process sees); `mps.client_env()` joins it."""

    def __init__(
        self,
        device: str | None,
        *,
        root: Path | None = None,
        runner: Runner = subprocess_runner,
        stop_wait_s: float = 10.0,
    ) -> None:
        self.device, self.runner, self.stop_wait_s = device, runner, stop_wait_s
        self._root_given = root
        self.dir: Path | None = None
        self.running = False

    @property
    def pipe_dir(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "pipe"

    @property
    def log_dir(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "log"

    def client_env(self) -> dict[str, str]:
        """What a process needs to join this daemon (and to see the daemon's device)."""
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.device
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # an index means NVML's (PCI order), not CUDA's
        return env

    def _run(self, argv: list[str], stdin: str | None = None) -> tuple[int, str]:
        return self.runner(argv, {**os.environ, **self.client_env()}, stdin)

    def start(self) -> None:
        # short: the pipe folder's sockets must fit in sun_path (108 bytes)
        self.dir = Path(tempfile.mkdtemp(prefix="mps-", dir=self._root_given))
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(mode=0o700)
        rc, out = self._run([CONTROL, "-d"])
        if rc != 0:
            self._cleanup()
            raise MPSError(f"{CONTROL} -d failed ({rc}): {out or 'no output'}")
        self.running = True

    def control(self, command: str) -> str:
        """One command through the control pipe (`get_server_list`, ...); MPSError if it fails."""
        rc, out = self._run([CONTROL], command + "\n")
        if rc != 0:
            raise MPSError(f"{command!r} failed ({rc}): {out}")
        return out

    def stop(self) -> None:
        """`quit`; if the control pipe is still there after stop_wait_s, `quit -t 5` (terminate clients)."""
        if not self.running:
            self._cleanup()
            return
        errors = []
        for command in ("quit", "quit -t 5"):
            try:
                rc, out = self._run([CONTROL], command + "\n")
            except MPSError as exc:
                errors.append(str(exc))
                continue
            if rc != 0:
                errors.append(f"{command!r} failed ({rc}): {out}")
            deadline = time.monotonic() + self.stop_wait_s
            while (self.pipe_dir / "control").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not (self.pipe_dir / "control").exists():
                self.running = False
                self._cleanup()
                return
        raise MPSError(
            f"MPS daemon for {self.device or 'the visible GPUs'} did not stop: {'; '.join(errors)} "
            f"(its log: {self.log_dir})"
        )

    def _cleanup(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> MPSSession:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
