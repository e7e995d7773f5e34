"""An instance batches a load its plan did not foresee (issue 46): calls that queue while its
batches are in flight join the next batch, up to the largest batch whose measured time fits half
the SLO, as Triton's and Ray Serve's batchers take what is queued; never more than that bound,
never below the planned size, and nothing changes for an instance without an SLO."""

from __future__ import annotations

import threading

import torch

from faas_gpu.batching import BOUND_CAP, BatchBound, BatchQueue, LocalBatching


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, s: float) -> None:
        with self.lock:
            self.t += s


def test_the_bound_is_the_largest_batch_whose_measured_time_fits_half_the_slo():
    b = BatchBound(0.250, floor=1)
    assert b.limit() == 1  # nothing measured: the planned size
    b.observe(1, 0.010)  # one size seen: 10 ms a row, no fixed part assumed (errs small)
    assert b.limit() == 12  # 12 x 10 ms <= 125 ms
    b.observe(8, 0.030)  # 8 rows in 30 ms: ~7.1 ms fixed + ~2.9 ms a row
    assert 35 <= b.limit() <= 41
    b.observe(8, 10.0)  # a slow moment is smoothed, not taken whole
    assert b.limit() < 35


def test_the_bound_never_goes_below_the_planned_batch_nor_above_its_cap():
    slow = BatchBound(0.100, floor=4)
    slow.observe(4, 0.400)  # the model alone misses the SLO: the plan's batch still forms
    assert slow.limit() == 4
    fast = BatchBound(10.0, floor=1)
    fast.observe(1, 0.001)
    assert fast.limit() == BOUND_CAP


def queue_behind_a_running_batch(slo_s, n=20):
    """A queue at batch 1 whose batch takes 10 ms a row (a fake clock): one call runs, `n` more
    queue while it does. The sizes of the batches run, in order."""
    clock, gate, started, sizes = FakeClock(), threading.Event(), threading.Event(), []

    def run(x, _cls):
        sizes.append(int(x.shape[0]))
        if not started.is_set():
            started.set()
            gate.wait(20)
        clock.advance(0.010 * x.shape[0])
        return x * 2, {}

    q = BatchQueue(run, max_batch=1, timeout_s=0.0, max_inflight=1, slo_s=slo_s, clock=clock)
    results: list[float] = []

    def call(v: float) -> None:
        results.append(q(torch.full((1, 1), v)).item())

    first = threading.Thread(target=call, args=(0.0,))
    first.start()
    assert started.wait(20)
    callers = [threading.Thread(target=call, args=(float(i),)) for i in range(1, n + 1)]
    for t in callers:
        t.start()
    while len(q._pending) < n:
        pass
    gate.set()
    for t in [first, *callers]:
        t.join(timeout=20)
    assert sorted(results) == [2.0 * i for i in range(n + 1)]
    return sizes


def test_calls_queued_behind_a_batch_join_the_next_batch_up_to_the_slos_bound():
    sizes = queue_behind_a_running_batch(0.250)
    assert sizes[:3] == [1, 12, 8]  # after 1 row in 10 ms: 12 rows fit 125 ms; then the rest


def test_without_an_slo_an_instance_keeps_its_planned_batch():
    assert queue_behind_a_running_batch(None) == [1] * 21


def test_the_cpu_path_keeps_its_planned_batches():
    """On the instance's CPU path a batch-1 plan runs calls in parallel on the request threads (no
    queue to hold them in): the bound is the GPU path's."""
    assert LocalBatching.from_env({"FAAS_GPU_MAX_BATCH": "1", "FAAS_GPU_SLO_MS": "250"}) is None
