"""The supervisor shared by the runtimes that run replicas themselves (processes, containers).

A supervisor thread restarts replicas that exited (with back-off), probes the watchdog's
`/_/ready` until a new replica serves, and keeps the count at the record's desired replicas (or
at the per-instance plan), rolling a new version out as a Kubernetes Deployment does
(`replicas.reconcile_count`). Whatever goes wrong with one function (a spec that no longer plans,
a start that raises, replicas that crash-loop or whose handler cannot load) is that function's
state, backed off and shown by `describe`; the others keep starting and serving. A new version
that goes wrong while an older one serves is its rollout's state instead: the older replicas
serve on, and describe says the rollout stalled and why.

Why a base class: the rules (rolling replacement, back-off, crash-loop state, one replica per
planned instance) are the same whether a replica is a process (`local`) or a container
(`docker`); a subclass says only how one replica is started, watched, probed and stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from typing import Any

from ..logs import LogStore
from ..types import FunctionRecord
from .base import InstanceSpec, LaunchError, Readiness, WatchedRuntime
from .output import note
from .replicas import (
    CRASH_LOOP_EXITS,
    FunctionReplicas,
    backoff_s,
    deployment_key,
    detach,
    reason,
    reconcile_count,
    reconcile_plan,
)

log = logging.getLogger(__name__)

SUPERVISE_EVERY_S = 0.1


class SupervisedRuntime(WatchedRuntime):
    """Desired state in, replicas out. Subclasses implement `plan`, `_spawn`, `_exit_status`,
    `_reap`, `_probe` and `_stop_all`; replicas are objects with `id`, `url`, `digest`, `slot`,
    `started`, `ready` and `stopping` (`processes.Replica`, `docker.ContainerReplica`)."""

    def __init__(self, logs: LogStore):
        self.logs = logs
        self._fns: dict[tuple[str, str], FunctionReplicas] = {}
        self._plans: dict[tuple[str, str], list[InstanceSpec]] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)

    def _start_supervisor(self) -> None:
        self._supervisor.start()

    # -- what a subclass provides ----------------------------------------------------------
    @abstractmethod
    def plan(self, record: FunctionRecord) -> Any:
        """The launch of `record`'s replicas (with `.digest` and `.stop_timeout_s`); LaunchError
        when it cannot run."""

    @abstractmethod
    def _spawn(self, fn: FunctionReplicas, inst: InstanceSpec | None, digest: str | None) -> Any:
        """Start one replica of `fn` (of planned instance `inst`, with its digest)."""

    @abstractmethod
    def _exit_status(self, replica: Any) -> str | None:
        """None while the replica runs; else how it ended, for the function's log ("exited with
        code 1", "was OOM-killed ..."). Called under the lock: must not block."""

    @abstractmethod
    def _reap(self, replica: Any) -> None:
        """Release what an exited replica leaves behind (its process group, its container)."""

    @abstractmethod
    def _probe(self, replica: Any) -> Readiness:
        """The replica's watchdog's answer to `/_/ready` (`base.probe_readiness`)."""

    @abstractmethod
    def _stop_all(self, replicas: list[Any], timeout_s: float) -> None:
        """Stop replicas (SIGTERM, drain up to timeout_s, then kill) and release them."""

    def _became_ready(self, replica: Any) -> None:
        """After `replica` first answered its probe (outside the lock); the local runtime re-pins
        the threads it started meanwhile."""

    def _closing(self) -> None:
        """Extra work at close, before the replicas are stopped."""

    # -- planning ------------------------------------------------------------------------
    def check(self, record: FunctionRecord) -> None:
        self.plan(record)

    # -- desired state -------------------------------------------------------------------
    def apply(self, record: FunctionRecord) -> None:
        """Take the record as desired state. A record that does not plan is still kept (its
        state shows why, and the supervisor retries it); the error is raised for the caller."""
        try:
            spec: Any = self.plan(record)
            error = None
        except Exception as exc:  # noqa: BLE001 — any bad record is its own function's problem
            spec, error = None, reason(exc)
        with self._lock:
            fn = self._fns.get(record.key)
            if fn is None:
                fn = self._fns[record.key] = FunctionReplicas(record, spec, plan=self._plans.get(record.key))
            else:
                spec = self._served_spec(fn, record, spec)
                changed = spec is None or fn.spec is None or fn.digests_of(spec) != fn.digests_of(fn.spec)
                fn.record, fn.spec = record, spec
                if changed:
                    fn.failures, fn.exits, fn.next_start = 0, 0, 0.0
                    fn.load_error = None
                    fn.served = any(r.ready for r in fn.current())
            if error is not None:
                self._failed(fn, error, time.monotonic())
            else:
                fn.start_error = None
            self._changed.notify_all()
        if error is not None:
            raise LaunchError(error)

    @staticmethod
    def _served_spec(fn: FunctionReplicas, record: FunctionRecord, planned: Any) -> Any:
        """`planned`, or the spec a previous deployment's replicas still run with when `record`
        goes back to that deployment (a rollback): its replicas are then the current version at
        once, even where the image's tag now names another build. Not for the deployment already
        current: deploying the same spec again after a rebuild rolls the new build out."""
        if planned is None or deployment_key(record) == deployment_key(fn.record):
            return planned
        served = fn.served_specs.get(deployment_key(record))
        if served is None or served.digest == planned.digest:
            return planned
        running = fn.digests_of(served)
        return served if any(r.digest in running and r.ready for r in fn.replicas) else planned

    def rollout(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            fn = self._fns.get((namespace, name))
            return fn.rollout(time.monotonic()) if fn is not None else None

    def version_served(self, namespace: str, name: str) -> bool:
        fn = self._fns.get((namespace, name))
        return fn is not None and fn.served

    def set_plan(self, namespace: str, name: str, plan: list[InstanceSpec] | None) -> None:
        """Run exactly these instances (None: back to record.replicas identical replicas)."""
        with self._lock:
            key = (namespace, name)
            if plan is None:
                self._plans.pop(key, None)
            else:
                self._plans[key] = list(plan)
            fn = self._fns.get(key)
            if fn is not None:
                fn.plan = None if plan is None else list(plan)
            self._changed.notify_all()

    def ready_instances(self, namespace: str, name: str) -> list[tuple[str, str]]:
        """(instance id, base URL) of the ready replicas; the id is the plan's for planned ones."""
        fn = self._fns.get((namespace, name))
        if fn is None:
            return []
        return [(r.slot or r.id, r.url) for r in fn.replicas if r.ready and not r.stopping]

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._plans.pop((namespace, name), None)
            fn = self._fns.pop((namespace, name), None)
        if fn:
            self._stop_all(fn.replicas, fn.stop_timeout_s)

    def endpoints(self, namespace: str, name: str) -> list[str]:
        fn = self._fns.get((namespace, name))
        if fn is None:
            return []
        return [r.url for r in fn.replicas if r.ready and not r.stopping]

    def instances(self, namespace: str, name: str) -> list[str]:
        fn = self._fns.get((namespace, name))
        return [r.id for r in fn.replicas] if fn else []

    def available(self, namespace: str, name: str) -> int:
        return len(self.endpoints(namespace, name))

    def close(self) -> None:
        self._closed.set()
        self._closing()
        with self._lock:
            fns = list(self._fns.values())
            self._fns.clear()
            self._changed.notify_all()
        threads = [threading.Thread(target=self._stop_all, args=(fn.replicas, fn.stop_timeout_s)) for fn in fns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- the supervisor ------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._closed.is_set():
            try:
                self._tick()
            except Exception:  # the supervisor must outlive any one bad replica
                log.exception("supervisor tick failed")
            self._closed.wait(SUPERVISE_EVERY_S)

    def _tick(self) -> None:
        with self._lock:
            items = list(self._fns.items())
        for _key, fn in items:
            try:
                self._tick_one(fn, time.monotonic())
            except Exception as exc:  # noqa: BLE001 — isolated to this function, backed off
                with self._lock:
                    self._failed(fn, reason(exc), time.monotonic())
                    self._changed.notify_all()

    def _tick_one(self, fn: FunctionReplicas, now: float) -> None:
        to_stop: list[Any] = []
        exited: list[Any] = []
        with self._lock:
            for r in list(fn.replicas):
                status = self._exit_status(r)
                if status is not None and not r.stopping:
                    fn.replicas.remove(r)
                    exited.append(r)
                    fn.failures += 1
                    fn.exits += 1
                    fn.next_start = now + backoff_s(fn.failures)
                    note(self.logs, fn.record, r.id, f"replica {status}")
                    if fn.exits == CRASH_LOOP_EXITS:
                        note(self.logs, fn.record, r.id, fn.problem["message"] if fn.problem else "crash-looping")
                        log.warning("%s.%s is crash-looping", fn.record.name, fn.record.namespace)
                        self._changed.notify_all()  # waiting requests give up now
            if fn.spec is None:
                if now < fn.next_start:
                    spec_missing = True
                else:
                    try:
                        fn.spec = self.plan(fn.record)
                        spec_missing = False
                    except Exception as exc:  # noqa: BLE001
                        self._failed(fn, reason(exc), now)
                        spec_missing = True
            else:
                spec_missing = False
            if not spec_missing:

                def start(inst: InstanceSpec | None, digest: str | None) -> bool:
                    return self._try_start(fn, now, inst, digest)

                if fn.plan is not None:
                    to_stop += reconcile_plan(fn, now, start)
                else:
                    to_stop += reconcile_count(fn, now, start)
                if not fn.stale():
                    fn.rollout_started = None
                elif fn.rollout_started is None:
                    fn.rollout_started = now
                if to_stop:
                    self._changed.notify_all()
        for r in exited:
            self._reap(r)
        if spec_missing:
            return
        if to_stop:
            stop_timeout = fn.stop_timeout_s
            threading.Thread(target=self._stop_all, args=(to_stop, stop_timeout), daemon=True).start()
        for r in [r for r in fn.replicas if not r.ready and not r.stopping]:
            if self._exit_status(r) is not None:
                continue
            answer = self._probe(r)
            if answer.ready:
                self._became_ready(r)
                with self._lock:
                    r.ready = True
                    fn.failures = fn.exits = 0
                    if r.digest in fn.digests_of(fn.spec):
                        fn.load_error = None
                        fn.remember_served()
                    self._changed.notify_all()
            elif answer.failed is not None:
                self._not_ready(fn, r, answer.failed, time.monotonic())

    def _not_ready(self, fn: FunctionReplicas, replica: Any, why: str, now: float) -> None:
        """The replica's own readiness check says it cannot serve (a handler that raised at
        import): it is stopped and, after a back-off, started again (a cause that passes heals);
        meanwhile the function, or its rollout, says why."""
        with self._lock:
            if replica not in fn.replicas:
                return
            detach(fn, [replica])
            fn.failures += 1
            fn.next_start = now + backoff_s(fn.failures)
            if why != fn.load_error:
                ref = f"{fn.record.name[:80]}.{fn.record.namespace}"
                log.error("%s replica %s is not ready: %s", ref, replica.id, why)
                note(self.logs, fn.record, replica.id, f"replica not ready, restarting with back-off: {why}")
            if replica.digest in fn.digests_of(fn.spec):
                fn.load_error = why
            self._changed.notify_all()
        threading.Thread(target=self._stop_all, args=([replica], fn.stop_timeout_s), daemon=True).start()

    def _failed(self, fn: FunctionReplicas, error: str, now: float) -> None:
        """A plan or start of `fn` failed: back off, and say so once per change of reason."""
        fn.failures += 1
        fn.next_start = now + backoff_s(fn.failures)
        if error != fn.start_error:
            log.error(
                "%s.%s cannot start (retrying with back-off): %s", fn.record.name[:80], fn.record.namespace, error
            )
            note(self.logs, fn.record, "supervisor", f"cannot start: {error}")
        fn.start_error = error

    def _try_start(
        self, fn: FunctionReplicas, now: float, inst: InstanceSpec | None = None, digest: str | None = None
    ) -> bool:
        """Start one replica; a failure (ENAMETOOLONG, E2BIG, a vanished image) backs `fn` off."""
        try:
            fn.replicas.append(self._spawn(fn, inst, digest))
        except Exception as exc:  # noqa: BLE001 — any failure is this function's alone
            self._failed(fn, reason(exc), now)
            return False
        fn.start_error = None
        return True
