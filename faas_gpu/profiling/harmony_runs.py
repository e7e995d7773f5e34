"""Profiling runs for HarmonyBatch's fitter on this machine's CPU: a torch model at several thread counts.

The runs measure (they run a model and set torch's process-wide thread count), so they live here,
with the other profilers, and not in `faas_gpu.policies`, whose fitter only takes their samples.

On a serverless platform the profiler varies the function's vCPU size; here torch's intra-op
thread count stands in for it. The clock is passed in (e.g. `time.perf_counter`): this module
reads no clock of its own, so a test can drive it with a fake one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from faas_gpu.policies.harmony.fitter import CpuSample


def profile_cpu(
    model: Callable[[Any], Any],
    make_batch: Callable[[int], Any],
    threads: Sequence[int],
    clock: Callable[[], float],
    batches: Sequence[int] = (1, 2, 3, 4),
    repeats: int = 5,
    warmup: int = 1,
) -> list[CpuSample]:
    """Run `model(make_batch(b))` `repeats` times per (thread count, batch); one CpuSample each.

    The thread count is restored afterwards. Latencies are in the clock's unit (seconds for
    `time.perf_counter`).
    """
    import torch

    if repeats < 1 or not threads or not batches:
        raise ValueError("profile_cpu: need threads, batches and repeats >= 1")
    before = torch.get_num_threads()
    samples = []
    try:
        with torch.inference_mode():
            for n in threads:
                torch.set_num_threads(int(n))
                for b in batches:
                    x = make_batch(b)
                    for _ in range(warmup):
                        model(x)
                    runs = []
                    for _ in range(repeats):
                        t0 = clock()
                        model(x)
                        runs.append(clock() - t0)
                    samples.append(CpuSample(int(b), float(n), tuple(runs)))
    finally:
        torch.set_num_threads(before)
    return samples
