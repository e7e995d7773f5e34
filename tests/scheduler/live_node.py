"""A live node for the scheduler tests: fake NVML GPUs under a real GPU Manager on real HTTP that
reports its units into a datastore, and a scheduler over it driven one placement round at a time.

Used by the Job Distribution, admission and late-work tests (tests/scheduler/).
"""

from __future__ import annotations

import threading

from werkzeug.serving import make_server

from faas_gpu.datastore import open_datastore
from faas_gpu.models import ModelStore
from faas_gpu.policies.protean.distribution import JobDistributor
from faas_gpu.policy_data.protean import default_assumptions
from faas_gpu.ports import free_port
from gpu_manager.api import create_app
from gpu_manager.daemon import StatusReporter
from gpu_manager.discovery import discover_units
from gpu_manager.manager import GPUManager
from scheduler.core import Scheduler
from tests.fake_nvml import FakeGPU, MigNVML
from tests.fake_worker import FakeWorker, stored_program

SD = default_assumptions().slowdown


class LiveNode:
    """Fake GPUs under a GPU Manager on real HTTP reporting into a datastore, and a scheduler over
    it (not started unless `start`), with PROTEAN's distributor unless `distribution` is False."""

    def __init__(
        self,
        tmp_path,
        gpus: list[tuple[FakeGPU, list]],
        distribution: bool = True,
        name: str = "s",
        policy: str = "lalb_o3",
    ):
        gpus = [(FakeGPU(g.name, g.memory_mb, g.profiles, mig=g.mig_on, uuid=g.uuid), layout) for g, layout in gpus]
        self.gpus = [g for g, _ in gpus]
        self.nvml = MigNVML(self.gpus)
        for gpu, layout in gpus:
            if layout:
                self.nvml.preset(gpu, layout)
        self.gate = threading.Event()
        self.manager = GPUManager(
            discover_units(self.nvml),
            ModelStore(tmp_path / f"models-{name}"),
            worker_factory=lambda a, d, env=None: FakeWorker(a, d, env, self.gate),
            nvml=self.nvml,
        )
        self.server = make_server("127.0.0.1", free_port(), create_app(self.manager, "t"), threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.ds = open_datastore(None, tmp_path / f"state-{name}.db")
        self.reporter = StatusReporter(self.manager, self.ds, "n1", f"http://127.0.0.1:{self.server.server_port}")
        self.reporter.report()
        self.now = 0.0
        self.scheduler = Scheduler(
            self.ds,
            ModelStore(tmp_path / f"sched-{name}"),
            "t",
            clock=lambda: self.now,
            policy=policy,
            distributor=JobDistributor(SD) if distribution else None,
        )
        self.scheduler.refresh_units()
        self.digest = stored_program(self.scheduler.store)

    def submit(self, model: str | None, best_effort: bool = False, digest: str | None = None):
        return self.scheduler.submit(digest or self.digest, b"x", 10.0, best_effort=best_effort, model=model)

    def round(self) -> list[str]:
        """One placement round: the profile (or unit kind) of the unit each job went to, in order."""
        with self.scheduler._lock:
            decisions, units = self.scheduler._round()
        return [self.label(units[d.unit].key) for d in decisions]

    def label(self, key: str) -> str:
        unit = key.split("/", 1)[1]
        info = self.manager.units[unit].info
        return info.profile or f"{info.kind}-{info.index}"

    def finish(self, job) -> None:
        """What the scheduler does when the manager answers: the unit is idle, the job gone."""
        s = self.scheduler
        with s._lock:
            i = next(i for i, u in enumerate(s._units) if u.key == job.unit)
            s._policy.complete(i, self.now)
            job.unit = None
            s._jobs.pop(job.id, None)

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.manager.close()
        self.scheduler.close()
        self.ds.close()
