"""CUDA MPS on the GPU Manager's units: one MPS control daemon per unit, each with its own pipes.

The daemon itself, its lifecycle (start confirmed by `get_server_list`; stop escalating quit,
quit -t, SIGTERM, SIGKILL; tracked until gone) and the runner that tests fake are core
(faas_gpu/mps.py), shared with the profiling runs' `MPSSession`. Here is only the manager's set:
a daemon per unit, its folders under the manager's home (`<home>/mps/<hash of the unit>`), and a
model's worker joins its unit's daemon through `client_env()`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from faas_gpu.mps import MPSDaemon, MPSError, Processes, Runner, Timeouts, subprocess_runner

log = logging.getLogger(__name__)


class MPSControl:
    """The manager's MPS daemons, one per unit, started on first use and stopped on shutdown.
    A daemon stays in `daemons` until it is gone: one that would not stop is stopped again later."""

    def __init__(
        self,
        root: Path,
        runner: Runner = subprocess_runner,
        processes: Processes | None = None,
        timeouts: Timeouts | None = None,
    ):
        self.root, self.runner = Path(root), runner
        self.processes, self.timeouts = processes, timeouts
        self.daemons: dict[str, MPSDaemon] = {}
        self._lock = threading.Lock()

    def ensure(self, unit: str) -> MPSDaemon:
        with self._lock:
            daemon = self.daemons.get(unit)
            if daemon is None:
                daemon = self.daemons[unit] = MPSDaemon(unit, self.root, self.runner, self.processes, self.timeouts)
            try:
                daemon.start()  # one that does not answer is stopped again before this raises
            except MPSError:
                if not daemon.running:
                    self.daemons.pop(unit, None)
                raise
            return daemon

    def stop(self, unit: str) -> None:
        with self._lock:
            daemon = self.daemons.get(unit)
        if daemon is None:
            return
        try:
            daemon.stop()
        except MPSError as exc:
            log.warning("%s", exc)
        with self._lock:
            if not daemon.running and self.daemons.get(unit) is daemon:
                del self.daemons[unit]

    def stop_all(self) -> None:
        for unit in list(self.daemons):
            self.stop(unit)
