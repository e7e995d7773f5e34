"""Rolling a new version out (provider/runtime/replicas.py), tick by tick without processes: a
Kubernetes Deployment's default RollingUpdate (maxSurge 25%, maxUnavailable 25%), and a version
whose replicas never become ready never takes over. The supervisor around these rules, with real
replicas, is tests/provider/test_rollout_live.py."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from provider.runtime.base import InstanceSpec
from provider.runtime.replicas import (
    CRASH_LOOP_EXITS,
    PROGRESS_DEADLINE_S,
    FunctionReplicas,
    reconcile_count,
    reconcile_plan,
    rolling_bounds,
)
from provider.types import FunctionDeployment, FunctionRecord

_ids = itertools.count()


@dataclass
class FakeReplica:
    digest: str
    slot: str | None = None
    ready: bool = False
    stopping: bool = False
    superseded: bool = False
    started: float = 0.0
    id: str = field(default_factory=lambda: f"r{next(_ids)}")


@dataclass
class FakeSpec:
    digest: str
    stop_timeout_s: float = 1.0
    cwd: Path | None = None


def _function(replicas: int, digest: str = "v1", ready: int | None = None, envvars: dict | None = None):
    record = FunctionRecord(FunctionDeployment("fn", "fn:latest", envVars=envvars), "openfaas-fn", replicas)
    fn = FunctionReplicas(record, FakeSpec(digest))  # type: ignore[arg-type]
    n = replicas if ready is None else ready
    fn.replicas = [FakeReplica(digest, ready=i < n) for i in range(replicas)]  # type: ignore[misc]
    return fn


def _tick(fn: FunctionReplicas, now: float = 0.0) -> list[FakeReplica]:
    """One reconcile; the replicas it starts are recorded on `fn` as the runtime's would be."""

    def start(inst, digest):
        fn.replicas.append(FakeReplica(digest or fn.spec.digest, slot=inst.id if inst else None, started=now))
        return True

    if fn.plan is not None:
        return reconcile_plan(fn, now, start)  # type: ignore[return-value]
    return reconcile_count(fn, now, start)  # type: ignore[return-value]


def _ready_all(fn: FunctionReplicas, digest: str) -> None:
    for r in fn.replicas:
        if r.digest == digest:
            r.ready = True


def _count(fn: FunctionReplicas, digest: str, ready: bool | None = None) -> int:
    return sum(r.digest == digest and (ready is None or r.ready == ready) for r in fn.replicas)


def test_rolling_bounds_round_as_a_deployment_does():
    """maxSurge rounds up, maxUnavailable down (Kubernetes' `ResolveFenceposts`), never both 0."""
    assert rolling_bounds(1) == (1, 0)
    assert rolling_bounds(3) == (1, 0)
    assert rolling_bounds(4) == (1, 1)
    assert rolling_bounds(10) == (3, 2)
    assert rolling_bounds(0) == (0, 0)


def test_a_new_version_comes_in_one_replica_at_a_time_and_an_old_one_goes_only_as_a_new_one_is_ready():
    fn = _function(3)
    fn.spec = FakeSpec("v2")
    stopped = _tick(fn)
    assert stopped == [] and _count(fn, "v2") == 1 and _count(fn, "v1", ready=True) == 3  # 25% surge: one
    for _ in range(3):  # nothing moves while the new replica is not ready
        assert _tick(fn) == [] and _count(fn, "v2") == 1 and _count(fn, "v1") == 3
    seen_ready = []
    for _ in range(10):
        _ready_all(fn, "v2")
        _tick(fn)
        seen_ready.append(sum(r.ready for r in fn.replicas))
        assert len(fn.replicas) <= 4  # never more than desired + maxSurge
    assert min(seen_ready) >= 3  # never fewer ready than desired - maxUnavailable (0 for 3)
    assert _count(fn, "v2", ready=True) == 3 and _count(fn, "v1") == 0


def test_a_version_whose_replicas_never_become_ready_does_not_take_over_and_the_rollout_says_why():
    fn = _function(3)
    fn.spec = FakeSpec("v2")
    for round_ in range(CRASH_LOOP_EXITS):
        _tick(fn, now=float(round_))
        new = [r for r in fn.replicas if r.digest == "v2"]
        assert len(new) == 1
        fn.replicas.remove(new[0])  # it exited before serving, as the supervisor records an exit
        fn.exits += 1
    _tick(fn, now=10.0)
    assert _count(fn, "v1", ready=True) == 3  # the old version serves on
    assert fn.problem is None  # the function serves: the trouble is the rollout's
    rollout = fn.rollout(now=10.0)
    assert rollout["state"] == "Stalled" and rollout["readyOldReplicas"] == 3
    assert f"exited {CRASH_LOOP_EXITS} times" in rollout["message"] and "faas-gpu rollback fn" in rollout["message"]


def test_a_new_version_whose_handler_cannot_load_stalls_with_the_handlers_error():
    fn = _function(3)
    fn.spec = FakeSpec("v2")
    _tick(fn)
    fn.load_error = "the handler failed to load: RuntimeError: broken setting"
    rollout = fn.rollout(now=1.0)
    assert rollout["state"] == "Stalled" and "RuntimeError: broken setting" in rollout["message"]
    assert fn.problem is None
    # with nothing of an older version serving, the same failure is the function's state
    alone = _function(1, ready=0)
    alone.load_error = "the handler failed to load: RuntimeError: broken setting"
    assert alone.problem["state"] == "StartFailed" and "broken setting" in alone.problem["message"]
    assert alone.rollout(now=1.0) is None


def test_a_rollout_without_a_ready_new_replica_for_the_progress_deadline_is_stalled():
    fn = _function(1)
    fn.spec = FakeSpec("v2")
    fn.rollout_started = 0.0
    _tick(fn)
    assert fn.rollout(now=1.0)["state"] == "Progressing"
    assert fn.rollout(now=PROGRESS_DEADLINE_S + 1)["state"] == "Stalled"
    _ready_all(fn, "v2")
    _tick(fn)
    assert fn.rollout(now=PROGRESS_DEADLINE_S + 2) is None and _count(fn, "v1") == 0


def test_old_replicas_that_do_not_serve_go_first():
    fn = _function(4, ready=2)  # two old replicas never became ready; 4 may lose one (25%)
    fn.spec = FakeSpec("v2")
    stopped = _tick(fn)
    assert [r.ready for r in stopped] == [False]
    assert _count(fn, "v1", ready=True) == 2 and len(fn.replicas) <= 4 + 1


def test_a_planned_instance_is_replaced_only_once_its_successor_serves():
    fn = _function(0)
    fn.plan = [InstanceSpec("a", {"FAAS_GPU_MAX_BATCH": "4"})]
    old_digest = fn.plan[0].digest("v1")
    fn.replicas = [FakeReplica(old_digest, slot="a", ready=True)]  # type: ignore[list-item]
    fn.spec = FakeSpec("v2")
    assert _tick(fn) == [] and len(fn.replicas) == 2
    successor = next(r for r in fn.replicas if r.digest != old_digest)
    fn.replicas.remove(successor)  # it crashed before serving: the old one serves on
    assert _tick(fn) == [] and any(r.digest == old_digest and r.ready for r in fn.replicas)
    for r in fn.replicas:
        r.ready = True
    stopped = _tick(fn)
    assert [r.digest for r in stopped] == [old_digest]


def test_a_superseded_replica_is_replaced_new_first_without_a_rollout():
    """A replica of the current version marked superseded (exec'd while the fork server started,
    `LocalRuntime`) goes as an older version's does: its successor first, it once that serves."""
    fn = _function(1)
    fn.replicas[0].superseded = True
    assert _tick(fn) == [] and len(fn.replicas) == 2  # the successor is started, the superseded one serves on
    successor = next(r for r in fn.replicas if not r.superseded)
    assert fn.rollout(now=1.0) is None and fn.problem is None  # one version: no rollout to report
    assert _tick(fn) == [] and len(fn.replicas) == 2  # nothing more while the successor is not ready
    successor.ready = True
    stopped = _tick(fn)
    assert [r.superseded for r in stopped] == [True] and fn.replicas == [successor]
    assert _tick(fn) == [] and fn.replicas == [successor]  # settled


def test_a_superseded_planned_instance_is_replaced_once_its_successor_serves():
    fn = _function(0)
    fn.plan = [InstanceSpec("a", {"FAAS_GPU_MAX_BATCH": "4"})]
    digest = fn.plan[0].digest("v1")
    fn.replicas = [FakeReplica(digest, slot="a", ready=True, superseded=True)]  # type: ignore[list-item]
    assert _tick(fn) == [] and len(fn.replicas) == 2
    successor = next(r for r in fn.replicas if not r.superseded)
    assert _tick(fn) == [] and len(fn.replicas) == 2
    successor.ready = True
    assert [r.superseded for r in _tick(fn)] == [True] and fn.replicas == [successor]


def test_status_numbers_are_typed_as_faas_provider_writes_them():
    """invocationCount and usage are float64 in function_status.go, which Go writes without a
    fraction when whole (`1`, not Python's `1.0`); replicas are uint64."""
    record = FunctionRecord(FunctionDeployment("fn", "fn:latest"), "openfaas-fn", 2)
    text = json.dumps(record.status(available=1, invocations=1, usage={"cpu": 12.5, "totalMemoryBytes": 1500000.0}))
    assert '"invocationCount": 1,' in text and '"replicas": 2,' in text and '"availableReplicas": 1,' in text
    assert '"totalMemoryBytes": 1500000}' in text and '"cpu": 12.5' in text
    assert '"invocationCount": 2.5' in json.dumps(record.status(available=0, invocations=2.5))


def test_the_previous_version_is_kept_with_the_record():
    v1 = FunctionDeployment("fn", "fn:1")
    record = FunctionRecord(FunctionDeployment("fn", "fn:2"), "openfaas-fn", 1, previous=v1)
    again = FunctionRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again.previous is not None and again.previous.image == "fn:1"
    assert FunctionRecord.from_json({**record.to_json(), "previous": None}).previous is None
