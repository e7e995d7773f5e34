"""Local-process runtime: each replica is a watchdog process on a free loopback port.

A supervisor thread restarts crashed replicas (with back-off), probes `/_/ready` until a new
replica serves, and keeps the count at the record's desired replicas. Whatever goes wrong with
one function (a spec that no longer plans, a start that raises, replicas that crash-loop) is
that function's state, backed off and shown by `describe`; the others keep starting and serving.

This module is the runtime's face and its supervisor; the roles it leans on have their own:
`launch` (a record as a command line and env), `processes` (a replica as a process),
`replicas` (per-function bookkeeping and reconciliation) and `output` (the function's log).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

from faas_gpu.contract import env as contract_env
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.imagestore import ImageStore
from faas_gpu.schedulers import Directory
from faas_gpu.schedulers import merge as merge_schedulers

from ..logs import LogStore
from ..store import SecretStore
from ..types import FunctionRecord
from .base import InstanceSpec, LaunchError, Runtime
from .launch import LaunchSpec, plan_launch
from .output import note, pump
from .processes import Replica, free_port, popen, probe, reap_stale, rss_bytes, signal_group, stop_all
from .replicas import CRASH_LOOP_EXITS, FunctionReplicas, backoff_s, reason, reconcile_count, reconcile_plan

log = logging.getLogger(__name__)

SUPERVISE_EVERY_S = 0.1


class LocalRuntime(Runtime):
    def __init__(
        self,
        home: Path,
        images: ImageStore,
        secrets: SecretStore,
        logs: LogStore,
        gpu_env: dict[str, str] | None = None,
        schedulers: Directory | None = None,
        credentials: FunctionCredentials | None = None,
    ):
        """`gpu_env`: how replicas reach the scheduler (GPU client); `credentials`: each function's
        own token for it (FAAS_GPU_TOKEN), never the cluster token, which stays with the daemons."""
        self.home = home
        self.gpu_env = dict(gpu_env or {})  # how replicas reach the scheduler (GPU client)
        self.schedulers = schedulers  # the replicas announced in the datastore, beside gpu_env's
        self.credentials = credentials
        self.images = images
        self.secrets = secrets
        self.logs = logs
        self.run_root = home / "run"
        self._fns: dict[tuple[str, str], FunctionReplicas] = {}
        self._plans: dict[tuple[str, str], list[InstanceSpec]] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        reap_stale(self.run_root)
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()

    # -- planning ------------------------------------------------------------------------
    def plan(self, record: FunctionRecord) -> LaunchSpec:
        return plan_launch(
            record, images=self.images, secrets=self.secrets, gpu_env=self.gpu_env, run_root=self.run_root
        )

    def check(self, record: FunctionRecord) -> None:
        self.plan(record)

    # -- desired state -------------------------------------------------------------------
    def apply(self, record: FunctionRecord) -> None:
        """Take the record as desired state. A record that does not plan is still kept (its
        state shows why, and the supervisor retries it); the error is raised for the caller."""
        try:
            spec: LaunchSpec | None = self.plan(record)
            error = None
        except Exception as exc:  # noqa: BLE001 — any bad record is its own function's problem
            spec, error = None, reason(exc)
        with self._lock:
            fn = self._fns.get(record.key)
            if fn is None:
                fn = self._fns[record.key] = FunctionReplicas(record, spec, plan=self._plans.get(record.key))
            else:
                changed = spec is None or fn.spec is None or any(r.digest != spec.digest for r in fn.replicas)
                fn.record, fn.spec = record, spec
                if changed:
                    fn.failures, fn.exits, fn.next_start = 0, 0, 0.0
            if error is not None:
                self._failed(fn, error, time.monotonic())
            else:
                fn.start_error = None
            self._changed.notify_all()
        if error is not None:
            raise LaunchError(error)

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
            stop_all(fn.replicas, fn.stop_timeout_s)

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

    def wait_ready(self, namespace: str, name: str, timeout_s: float) -> bool:
        """Wait for a ready replica; give up at once when the function cannot start or crash-loops."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self.endpoints(namespace, name):
                left = deadline - time.monotonic()
                fn = self._fns.get((namespace, name))
                if left <= 0 or fn is None or fn.problem is not None:
                    return False
                self._changed.wait(min(left, 0.5))
            return True

    def problem(self, namespace: str, name: str) -> dict[str, str] | None:
        fn = self._fns.get((namespace, name))
        return fn.problem if fn is not None else None

    def usage(self, namespace: str, name: str) -> dict | None:
        fn = self._fns.get((namespace, name))
        if fn is None:
            return None
        return {"cpu": 0.0, "totalMemoryBytes": float(rss_bytes(fn.replicas))}

    def close(self) -> None:
        self._closed.set()
        if self.schedulers is not None:
            self.schedulers.close()
        with self._lock:
            fns = list(self._fns.values())
            self._fns.clear()
            self._changed.notify_all()
        threads = [threading.Thread(target=stop_all, args=(fn.replicas, fn.stop_timeout_s)) for fn in fns]
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
        to_stop: list[Replica] = []
        with self._lock:
            for r in list(fn.replicas):
                code = r.proc.poll()
                if code is not None and not r.stopping:
                    fn.replicas.remove(r)
                    signal_group(r.proc, signal.SIGKILL)  # the leader died: so does its group
                    fn.failures += 1
                    fn.exits += 1
                    fn.next_start = now + backoff_s(fn.failures)
                    note(self.logs, fn.record, r.id, f"replica exited with code {code}")
                    if fn.exits == CRASH_LOOP_EXITS:
                        note(self.logs, fn.record, r.id, fn.problem["message"] if fn.problem else "crash-looping")
                        log.warning("%s.%s is crash-looping", fn.record.name, fn.record.namespace)
                        self._changed.notify_all()  # waiting requests give up now
                    shutil.rmtree(r.run_dir, ignore_errors=True)
            if fn.spec is None:
                if now < fn.next_start:
                    return
                try:
                    fn.spec = self.plan(fn.record)
                except Exception as exc:  # noqa: BLE001
                    self._failed(fn, reason(exc), now)
                    return

            def start(inst: InstanceSpec | None, digest: str | None) -> bool:
                return self._try_start(fn, now, inst, digest)

            if fn.plan is not None:
                to_stop += reconcile_plan(fn, now, start)
            else:
                to_stop += reconcile_count(fn, now, start)
            if to_stop:
                self._changed.notify_all()
        spec = fn.spec
        if to_stop:
            threading.Thread(target=stop_all, args=(to_stop, spec.stop_timeout_s), daemon=True).start()
        for r in [r for r in fn.replicas if not r.ready and r.proc.poll() is None]:
            if probe(r):
                with self._lock:
                    r.ready = True
                    fn.failures = fn.exits = 0
                    self._changed.notify_all()

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
            fn.replicas.append(self._start(fn, inst, digest))
        except Exception as exc:  # noqa: BLE001 — any failure is this function's alone
            self._failed(fn, reason(exc), now)
            return False
        fn.start_error = None
        return True

    def _start(self, fn: FunctionReplicas, inst: InstanceSpec | None = None, digest: str | None = None) -> Replica:
        record, spec = fn.record, fn.spec
        assert spec is not None
        rid = f"{inst.id if inst else record.name}-{uuid.uuid4().hex[:8]}"
        run_dir = self.run_root / record.namespace / rid
        try:
            return self._spawn(record, spec, rid, run_dir, inst, digest)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise

    def _spawn(
        self,
        record: FunctionRecord,
        spec: LaunchSpec,
        rid: str,
        run_dir: Path,
        inst: InstanceSpec | None,
        digest: str | None,
    ) -> Replica:
        tmp = run_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        secrets_dir = run_dir / "secrets"
        secrets_dir.mkdir(mode=0o700)
        for secret in record.deployment.secrets or ():
            dest = secrets_dir / secret
            shutil.copyfile(self.secrets.path(record.namespace, secret), dest)
            os.chmod(dest, 0o600)
        port = free_port()
        env = dict(spec.env)
        if inst is not None:
            env.update(inst.env)
        env.update(
            port=str(port),
            TMPDIR=str(tmp),
            HOSTNAME=rid,
            secret_mount_path=str(secrets_dir),
        )
        env[contract_env.FUNCTION.name] = record.name
        env[contract_env.PARENT_PID.name] = str(os.getpid())  # the watchdog dies with this provider
        env[contract_env.NAMESPACE.name] = record.namespace
        url = contract_env.SCHEDULER_URL.name
        if env.get(url) and self.schedulers is not None:  # every scheduler
            env[url] = merge_schedulers(env[url], self.schedulers.urls())
        if self.gpu_env and self.credentials is not None:
            env[contract_env.TOKEN.name] = self.credentials.token(record.namespace, record.name)
        if spec.http_mode and "upstream_url" not in spec.env:
            env["upstream_url"] = f"http://127.0.0.1:{free_port()}"
        proc = popen(spec.argv, spec.cwd, env, run_dir, port)
        replica = Replica(rid, port, proc, run_dir, digest or spec.digest, slot=inst.id if inst else None)
        args = (self.logs, record.namespace, record.name, rid, proc)
        threading.Thread(target=pump, args=args, daemon=True).start()
        return replica
