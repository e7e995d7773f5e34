"""A job whose model does not fit its unit even alone (the manager's 507, known only once it
tried: activations at this batch, a context larger than expected) is placed again on a larger
unit, and the model is never placed on a unit that small again; with no larger unit the caller
gets the 507."""

from __future__ import annotations

import torch

from faas_gpu.contract.wire import encode
from gpu_manager.worker import OutOfDeviceMemory
from tests.fake_nvml import FakeGPU
from tests.fake_worker import FakeWorker
from tests.scheduler.live_node import LiveNode


class TooBigFor1g(FakeWorker):
    """Out of memory at load on the 1g slice, whatever the manager expected of the model."""

    small: str = ""

    def start(self):
        if self.env and self.env.get("CUDA_VISIBLE_DEVICES") == TooBigFor1g.small:
            raise OutOfDeviceMemory("CUDA out of memory (the batch's activations)")
        super().start()


def _node(tmp_path, layout) -> LiveNode:
    node = LiveNode(tmp_path, [(FakeGPU.a100_40gb(), layout)], distribution=False)
    node.gate.set()  # jobs answer at once
    TooBigFor1g.small = next(u for u, s in node.manager.units.items() if s.info.profile == "1g.5gb")
    node.manager.worker_factory = lambda a, d, env=None: TooBigFor1g(a, d, env, node.gate)
    return node


def _submit(node: LiveNode):
    return node.scheduler.submit(node.digest, encode(torch.zeros(1, 4)), 10.0)


def _run_until_done(node: LiveNode, *jobs, rounds: int = 8) -> list[str]:
    """Placement rounds, each decision executed as the loop's pool threads would; the units tried."""
    tried = []
    for _ in range(rounds):
        with node.scheduler._lock:
            decisions, units = node.scheduler._round()
        for d in decisions:
            tried.append(node.label(units[d.unit].key))
            node.scheduler._execute(d, units[d.unit])
        if all(j.done.is_set() for j in jobs):
            break
    return tried


def test_a_job_that_does_not_fit_its_unit_even_alone_goes_to_a_larger_one(tmp_path):
    node = _node(tmp_path, [("4g.20gb", 0), ("1g.5gb", 6)])
    try:
        small = next(u for u in node.scheduler._units if u.profile == "1g.5gb")
        jobs = [_submit(node), _submit(node)]  # both units idle: one job each
        tried = _run_until_done(node, *jobs)
        assert [j.outcome.status for j in jobs] == [200, 200], (tried, [j.outcome for j in jobs])
        assert sorted(tried) == ["1g.5gb", "4g.20gb", "4g.20gb"], tried  # the 1g's job placed again, on the 4g
        # from now on the model is known to need more than the 1g: never placed there again
        assert node.scheduler.catalog.models[node.digest].size_mb > small.memory_mb
        again = [_submit(node), _submit(node)]
        assert _run_until_done(node, *again) == ["4g.20gb", "4g.20gb"]
        assert [j.outcome.status for j in again] == [200, 200]
    finally:
        node.close()


def test_with_no_larger_unit_the_caller_gets_the_managers_507(tmp_path):
    node = _node(tmp_path, [("1g.5gb", 6)])
    try:
        job = _submit(node)
        assert _run_until_done(node, job) == ["1g.5gb"]
        assert job.outcome.status == 507 and b"even alone" in job.outcome.body
    finally:
        node.close()
