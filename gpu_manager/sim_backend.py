"""The `sim` back end: profiled timings only, for load tests of the whole path without a GPU.

A sim worker runs no model: a batch of b takes the profiled latency for b (INFless's profile
files: `<model> <cpuThreads> <gpuSM%> <batch> <latency_ms>`, one configuration chosen by threads
and SM share; batches between profiled sizes take the next larger one's time), and answers a
zero tensor of shape [b, out_features]. Loading takes `load_s`.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.infless_profiles import INFEASIBLE_MS, load_profile

from .worker import LoadedInfo, ModelInputError


@dataclass(frozen=True)
class Profile:
    batches: list[int]
    latency_s: list[float]

    def latency(self, batch: int) -> float:
        i = bisect.bisect_left(self.batches, batch)
        if i == len(self.batches):
            raise ModelInputError(f"batch {batch} is beyond the profile (largest {self.batches[-1]})")
        return self.latency_s[i]

    @classmethod
    def from_infless(cls, path: Path, threads: int, sm_percent: int) -> Profile:
        points = {r.batch: r.ms / 1000 for r in load_profile(path) if r.cpu == threads and r.gpu == sm_percent}
        points = {b: t for b, t in points.items() if t * 1000 < INFEASIBLE_MS}
        if not points:
            raise ValueError(f"{Path(path).name}: no feasible rows for {threads} threads at {sm_percent}% SM")
        batches = sorted(points)
        return cls(batches, [points[b] for b in batches])


class SimWorker:
    """Stands in for `Worker`: same interface, profiled time instead of a model."""

    def __init__(self, profile: Profile, load_s: float = 0.5, out_features: int = 1000):
        self.profile, self.load_s, self.out_features = profile, load_s, out_features
        self._alive = False
        self._lock = threading.Lock()
        self.info: LoadedInfo | None = None

    def start(self, timeout_s: float = 120) -> LoadedInfo:
        time.sleep(self.load_s)
        self._alive = True
        self.info = LoadedInfo(0, self.load_s)
        return self.info

    @property
    def alive(self) -> bool:
        return self._alive

    def run(self, payload: bytes, timeout_s: float = 60) -> bytes:
        x = decode(payload)
        batch = x.shape[0] if x.dim() else 1
        with self._lock:  # one job at a time, as on a real unit
            time.sleep(self.profile.latency(batch))
        return encode(torch.zeros(batch, self.out_features))

    def stop(self) -> None:
        self._alive = False
