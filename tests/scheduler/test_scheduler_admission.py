"""What the scheduler's class queue hands its placement policy: enough look-ahead, no more."""

import pytest

from tests.fake_nvml import FakeGPU
from tests.scheduler.live_node import LiveNode


@pytest.mark.parametrize(("policy", "spreads"), [("lalb_o3", True), ("lb", False)])
def test_lalb_sees_a_load_time_of_backlog_per_unit_and_lb_one_job(tmp_path, policy, spreads):
    node = LiveNode(
        tmp_path, [(FakeGPU.a100_40gb(mig=False), []), (FakeGPU.a100_40gb(mig=False), [])], False, policy=policy
    )
    try:
        for _ in range(60):
            node.submit(None)
        s = node.scheduler
        with s._lock:
            s._admit(node.now)
            admitted, waiting = s._policy.queued(), len(s._admission)
            work = s._policy.queued_work_s()
        assert admitted + waiting == 60
        units = len(s._units)
        assert units == 2
        if spreads:  # LALB spreads a busy model once a holder's backlog reaches the load time
            assert work >= units * max(m.load_s for m in s._models.values()) and waiting > 0
        else:
            assert admitted == units
    finally:
        node.close()


def test_strict_jobs_still_overtake_best_effort_ones_past_the_look_ahead(tmp_path):
    node = LiveNode(tmp_path, [(FakeGPU.a100_40gb(mig=False), [])], False)
    try:
        be = [node.submit(None, best_effort=True) for _ in range(100)]  # the look-ahead fills with these
        strict = node.submit(None)
        s = node.scheduler
        with s._lock:
            assert not strict.admitted and be[0].admitted and not be[-1].admitted
            assert s._admission.peek(node.now) is strict  # next in, ahead of 70-odd best-effort jobs
    finally:
        node.close()
