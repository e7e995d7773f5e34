"""The serverless platform HarmonyBatch provisions on: its search space and function shapes.

Ranges are the paper's §IV-B and the reference's `config.json` (vCPU 0.05..16 in steps of 0.05,
GPU memory 1..24 GB in steps of 1, batch 1..4 on CPU and 1..32 on GPU). The shape rules are
Alibaba Cloud Function Compute's, as the authors' code applies them: a CPU function's memory is
what the model needs, at least 1 GB per vCPU and at most 4 GB per vCPU, in 64 MB steps; a GPU
function carries 1/3 vCPU per GB of GPU memory and the model's host memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Platform:
    vcpu_min: float = 0.05
    vcpu_max: float = 16.0
    vcpu_step: float = 0.05
    gpu_min_gb: int = 1
    gpu_max_gb: int = 24
    cpu_batch_max: int = 4
    gpu_batch_max: int = 32
    mem_step_mb: int = 64
    max_gb_per_vcpu: float = 4.0
    gpu_vcpu_per_gb: float = 1.0 / 3.0

    @cached_property
    def vcpu_grid(self) -> tuple[float, ...]:
        """Every vCPU size a CPU function may have (rounded to the step, as the platform takes them)."""
        n = int(round((self.vcpu_max - self.vcpu_min) / self.vcpu_step))
        return tuple(round(self.vcpu_min + i * self.vcpu_step, 2) for i in range(n + 1))

    def round_mb(self, mb: float) -> int:
        """Memory sizes go in whole `mem_step_mb` steps (the platform rounds up)."""
        mb = int(mb)
        return -(-mb // self.mem_step_mb) * self.mem_step_mb

    def cpu_memory_gb(self, vcpu: float, model_mb: float) -> float | None:
        """A CPU function's memory: the model's need, at least `vcpu` GB; None above 4 GB per vCPU."""
        need_gb = self.round_mb(model_mb) / 1024
        if need_gb > self.max_gb_per_vcpu * vcpu:
            return None
        return self.round_mb(max(need_gb, vcpu) * 1024) / 1024

    def min_vcpu_for(self, model_mb: float) -> float:
        """Fewest vCPU whose 4 GB/vCPU cap still holds the model."""
        return self.round_mb(model_mb) / 1024 / self.max_gb_per_vcpu

    def gpu_function(self, gpu_gb: int, host_mb: float) -> tuple[float, float] | None:
        """(vCPU, memory GB) of a GPU function with `gpu_gb` of GPU memory; None if the host memory does not fit."""
        vcpu = gpu_gb * self.gpu_vcpu_per_gb
        mem_gb = self.round_mb(host_mb) / 1024
        if mem_gb > self.max_gb_per_vcpu * vcpu:
            return None
        return vcpu, mem_gb

    def snap_vcpu(self, vcpu: float) -> float:
        """Nearest grid size, kept inside the range."""
        i = round((vcpu - self.vcpu_min) / self.vcpu_step)
        i = min(max(i, 0), len(self.vcpu_grid) - 1)
        return self.vcpu_grid[i]

    def vcpu_index_at_least(self, vcpu: float) -> int:
        """Index of the smallest grid size >= vcpu (len(grid) when none)."""
        i = math.ceil((vcpu - self.vcpu_min) / self.vcpu_step - 1e-9)
        return min(max(i, 0), len(self.vcpu_grid))

    @classmethod
    def from_config(cls, data: dict) -> Platform:
        """From the reference's `config.json` keys (Res_CPU, Res_GPU, B_CPU, B_GPU); other keys are ignored."""
        kw: dict = {}
        if "Res_CPU" in data:
            kw["vcpu_min"], kw["vcpu_max"] = float(data["Res_CPU"][0]), float(data["Res_CPU"][1])
        if "Res_GPU" in data:
            kw["gpu_min_gb"], kw["gpu_max_gb"] = int(data["Res_GPU"][0]), int(data["Res_GPU"][1])
        if "B_CPU" in data:
            if int(data["B_CPU"][0]) != 1:
                raise ValueError("B_CPU must start at 1")
            kw["cpu_batch_max"] = int(data["B_CPU"][1])
        if "B_GPU" in data:
            if int(data["B_GPU"][0]) != 1:
                raise ValueError("B_GPU must start at 1")
            kw["gpu_batch_max"] = int(data["B_GPU"][1])
        return cls(**kw)
