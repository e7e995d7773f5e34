"""`GET /v1/status`'s `queues`: jobs waiting in the global queues by class, and those each unit holds."""

from __future__ import annotations

from scheduler.api import _queues


def test_queues_count_waiting_jobs_by_class_and_resident_ones_by_unit():
    resident = [(None, False, "m"), (None, True, None), (None, True, "m"), ("n/u0", False, "m"), ("n/u0", True, None)]
    assert _queues(resident) == {"strict": 1, "best-effort": 2, "units": {"n/u0": 2}}
    assert _queues([]) == {"strict": 0, "best-effort": 0, "units": {}}
