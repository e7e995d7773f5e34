"""Local-process runtime: each replica is a watchdog process on a free loopback port.

A supervisor thread restarts crashed replicas (with back-off), probes `/_/ready` until a new
replica serves, and keeps the count at the record's desired replicas.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from faas_gpu import paths
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.imagestore import ImageStore

from ..config import parse_duration
from ..logs import LogStore
from ..store import SecretStore
from ..types import FunctionRecord
from .base import LaunchError, Runtime

log = logging.getLogger(__name__)

CLASSIC_WATCHDOG = paths.TEMPLATES_DIR / "python3-gpu" / "fwatchdog.py"
PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "OMP_NUM_THREADS", "PYTHONPATH")
MAX_BACKOFF_S = 30.0
SUPERVISE_EVERY_S = 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LaunchSpec:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    http_mode: bool
    stop_timeout_s: float
    digest: str


@dataclass(frozen=True)
class InstanceSpec:
    """One instance of a function that an autoscaler sized on its own (INFless's non-uniform
    instances): a stable id, and the env that gives it its batch size, threads and share."""

    id: str
    env: dict[str, str] = field(default_factory=dict)

    def digest(self, spec_digest: str) -> str:
        return hashlib.sha256(json.dumps([spec_digest, self.env], sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Replica:
    id: str
    port: int
    proc: subprocess.Popen
    run_dir: Path
    digest: str
    slot: str | None = None
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    stopping: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class _Function:
    record: FunctionRecord
    spec: LaunchSpec
    replicas: list[Replica] = field(default_factory=list)
    failures: int = 0
    next_start: float = 0.0
    plan: list[InstanceSpec] | None = None
    """When set, the replicas are exactly these instances (and record.replicas is ignored)."""


class LocalRuntime(Runtime):
    def __init__(
        self,
        home: Path,
        images: ImageStore,
        secrets: SecretStore,
        logs: LogStore,
        gpu_env: dict[str, str] | None = None,
        credentials: FunctionCredentials | None = None,
    ):
        """`gpu_env`: how replicas reach the scheduler (GPU client); `credentials`: each function's
        own token for it (FAAS_GPU_TOKEN), never the cluster token, which stays with the daemons."""
        self.home = home
        self.gpu_env = dict(gpu_env or {})
        self.credentials = credentials
        self.images = images
        self.secrets = secrets
        self.logs = logs
        self.run_root = home / "run"
        self._fns: dict[tuple[str, str], _Function] = {}
        self._plans: dict[tuple[str, str], list[InstanceSpec]] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._reap_stale()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()

    # -- planning ------------------------------------------------------------------------
    def plan(self, record: FunctionRecord) -> LaunchSpec:
        dep = record.deployment
        env_vars = dict(dep.envVars or {})
        base_env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        image = self.images.get(dep.image)
        if image is not None:
            fprocess = dep.envProcess or image.fprocess
            watchdog = Path(image.context) / "fwatchdog.py"
            if not watchdog.exists():
                watchdog = CLASSIC_WATCHDOG
            argv = [sys.executable, str(watchdog)]
            cwd = Path(image.context)
            venv_bin = str(Path(image.python).parent)
            base_env["PATH"] = venv_bin + os.pathsep + base_env.get("PATH", os.defpath)
            base_env["VIRTUAL_ENV"] = str(Path(image.python).parent.parent)
            mode = env_vars.get("mode", "http")
            image_id = f"{image.image}@{getattr(image, 'created', '')}"
        elif dep.envProcess:
            words = shlex.split(dep.envProcess)
            if not words or shutil.which(words[0]) is None:
                raise LaunchError(
                    f"image: {dep.image!r} is not in the local image store (build it with "
                    f"`faas-gpu build`) and envProcess {dep.envProcess!r} is not runnable here"
                )
            fprocess, argv, cwd = dep.envProcess, [sys.executable, str(CLASSIC_WATCHDOG)], None
            mode = env_vars.get("mode", "classic")
            image_id = dep.image
        else:
            raise LaunchError(
                f"image: {dep.image!r} is not in the local image store; build it with "
                "`faas-gpu build -f stack.yml` (or give an envProcess that runs on this host)"
            )
        for timeout_key in ("read_timeout", "write_timeout", "exec_timeout"):
            if timeout_key in env_vars:
                try:
                    parse_duration(env_vars[timeout_key], f"envVars.{timeout_key}")
                except ValueError as exc:
                    raise LaunchError(str(exc)) from None
        klass = (dep.annotations or {}).get("com.faas-gpu.class")
        if klass is not None and klass not in ("strict", "best-effort"):
            raise LaunchError(f"annotations: com.faas-gpu.class must be strict or best-effort, got {klass!r}")
        for secret in dep.secrets or ():
            if not self.secrets.exists(record.namespace, secret):
                raise LaunchError(f"secrets: secret {secret!r} not found in namespace {record.namespace}")
        stop_timeout = parse_duration(env_vars.get("write_timeout", "30s")) + 5.0
        env = {
            **base_env,
            "PYTHONUNBUFFERED": "1",
            "fprocess": fprocess,
            "mode": mode,
            "metrics_port": "0",
            "bind_address": "127.0.0.1",
            "healthcheck_interval": "100ms",
            **self.gpu_env,
            **_gpu_settings(dep.annotations or {}),
            **env_vars,
        }
        digest = hashlib.sha256(
            json.dumps([record.deployment.to_json(), image_id], sort_keys=True).encode()
        ).hexdigest()[:16]
        return LaunchSpec(argv, cwd or self.run_root, env, mode == "http", stop_timeout, digest)

    def check(self, record: FunctionRecord) -> None:
        self.plan(record)

    # -- desired state -------------------------------------------------------------------
    def apply(self, record: FunctionRecord) -> None:
        spec = self.plan(record)
        with self._lock:
            fn = self._fns.get(record.key)
            if fn is None:
                self._fns[record.key] = _Function(record, spec, plan=self._plans.get(record.key))
            else:
                fn.record, fn.spec = record, spec
                if any(r.digest != spec.digest for r in fn.replicas):
                    fn.failures, fn.next_start = 0, 0.0
            self._changed.notify_all()

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
            self._stop_all(fn.replicas, fn.spec.stop_timeout_s)

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
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self.endpoints(namespace, name):
                left = deadline - time.monotonic()
                if left <= 0 or (namespace, name) not in self._fns:
                    return False
                self._changed.wait(min(left, 0.5))
            return True

    def usage(self, namespace: str, name: str) -> dict | None:
        fn = self._fns.get((namespace, name))
        if fn is None:
            return None
        rss = 0
        page = os.sysconf("SC_PAGE_SIZE")
        for r in fn.replicas:
            for pid in _process_tree(r.proc.pid):
                try:
                    rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, IndexError, ValueError):
                    pass
        return {"cpu": 0.0, "totalMemoryBytes": float(rss)}

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            fns = list(self._fns.values())
            self._fns.clear()
            self._changed.notify_all()
        threads = [threading.Thread(target=self._stop_all, args=(fn.replicas, fn.spec.stop_timeout_s)) for fn in fns]
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
        now = time.monotonic()
        with self._lock:
            items = list(self._fns.items())
        for _key, fn in items:
            to_stop: list[Replica] = []
            with self._lock:
                for r in list(fn.replicas):
                    code = r.proc.poll()
                    if code is not None and not r.stopping:
                        fn.replicas.remove(r)
                        self._log(fn, r.id, f"replica exited with code {code}")
                        fn.failures += 1
                        fn.next_start = now + min(MAX_BACKOFF_S, 0.5 * 2 ** (fn.failures - 1))
                        shutil.rmtree(r.run_dir, ignore_errors=True)
                if fn.plan is not None:
                    to_stop += self._reconcile_plan(fn, now)
                else:
                    to_stop += self._reconcile_count(fn, now)
                if to_stop:
                    self._changed.notify_all()
            if to_stop:
                threading.Thread(target=self._stop_all, args=(to_stop, fn.spec.stop_timeout_s), daemon=True).start()
            for r in [r for r in fn.replicas if not r.ready and r.proc.poll() is None]:
                if self._probe(r, fn.spec.http_mode):
                    with self._lock:
                        r.ready = True
                        fn.failures = 0
                        self._changed.notify_all()

    def _reconcile_count(self, fn: _Function, now: float) -> list[Replica]:
        """Replace replicas of an old spec (new ones first), then match record.replicas."""
        to_stop: list[Replica] = []
        stale = [r for r in fn.replicas if r.digest != fn.spec.digest]
        current = [r for r in fn.replicas if r.digest == fn.spec.digest]
        want = fn.record.replicas
        if stale and (all(r.ready for r in current) or not current) and len(current) >= min(want, 1):
            to_stop += stale
        extra = len(current) - want
        if extra > 0:
            to_stop += sorted(current, key=lambda r: (r.ready, r.started))[:extra]
        self._detach(fn, to_stop)
        if len(current) < want and now >= fn.next_start:
            for _ in range(want - len(current)):
                fn.replicas.append(self._start(fn))
        return to_stop

    def _reconcile_plan(self, fn: _Function, now: float) -> list[Replica]:
        """One replica per planned instance; a changed instance is replaced once its successor serves."""
        assert fn.plan is not None
        want = {inst.id: inst for inst in fn.plan}
        digests = {inst.id: inst.digest(fn.spec.digest) for inst in fn.plan}
        by_slot: dict[str, list[Replica]] = {}
        leaving = [r for r in fn.replicas if r.slot not in want]
        serving = {r.slot for r in fn.replicas if r.ready and r.slot in want and r.digest == digests[r.slot]}
        # instances dropped from the plan serve until every planned one does (no gap in a re-plan)
        to_stop = leaving if serving >= set(want) or not any(r.ready for r in leaving) else []
        for r in fn.replicas:
            if r.slot in want:
                by_slot.setdefault(r.slot, []).append(r)
        for slot, inst in want.items():
            mine = by_slot.get(slot, [])
            current = [r for r in mine if r.digest == digests[slot]]
            old = [r for r in mine if r.digest != digests[slot]]
            if old and (not current or current[0].ready):
                to_stop += old
            if not current and now >= fn.next_start:
                fn.replicas.append(self._start(fn, inst, digests[slot]))
        self._detach(fn, to_stop)
        return to_stop

    @staticmethod
    def _detach(fn: _Function, to_stop: list[Replica]) -> None:
        for r in to_stop:
            r.stopping = True
            if r in fn.replicas:
                fn.replicas.remove(r)

    def _probe(self, r: Replica, _http_mode: bool) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=0.5)
        try:
            conn.request("GET", "/_/ready")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _start(self, fn: _Function, inst: InstanceSpec | None = None, digest: str | None = None) -> Replica:
        record, spec = fn.record, fn.spec
        rid = f"{inst.id if inst else record.name}-{uuid.uuid4().hex[:8]}"
        run_dir = self.run_root / record.namespace / rid
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
            FAAS_GPU_FUNCTION=record.name,
            FAAS_GPU_NAMESPACE=record.namespace,
        )
        if self.gpu_env and self.credentials is not None:
            env["FAAS_GPU_TOKEN"] = self.credentials.token(record.namespace, record.name)
        if spec.http_mode and "upstream_url" not in spec.env:
            env["upstream_url"] = f"http://127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            spec.argv,
            cwd=spec.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (run_dir / "pid").write_text(str(proc.pid))
        (run_dir / "port").write_text(str(port))  # lets benchmarks reach the watchdog directly
        replica = Replica(rid, port, proc, run_dir, digest or spec.digest, slot=inst.id if inst else None)
        threading.Thread(target=self._pump, args=(record.namespace, record.name, rid, proc), daemon=True).start()
        return replica

    def _pump(self, namespace: str, name: str, rid: str, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            self.logs.append(namespace, name, rid, raw.decode("utf-8", "replace").rstrip("\n"))

    def _log(self, fn: _Function, rid: str, text: str) -> None:
        self.logs.append(fn.record.namespace, fn.record.name, rid, text)

    def _stop_all(self, replicas: list[Replica], timeout_s: float) -> None:
        for r in replicas:
            r.stopping = True
            # the watchdog alone: it drains its in-flight requests, then stops its own child
            try:
                r.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        for r in replicas:
            try:
                r.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(r.proc, signal.SIGKILL)
                r.proc.wait()
            _signal_group(r.proc, signal.SIGKILL)  # children the watchdog left behind
            shutil.rmtree(r.run_dir, ignore_errors=True)

    def _reap_stale(self) -> None:
        """Kill replicas a crashed provider left running (their pids are in run/)."""
        if not self.run_root.exists():
            return
        for pid_file in self.run_root.glob("*/*/pid"):
            try:
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"fwatchdog" in cmdline:
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        shutil.rmtree(self.run_root, ignore_errors=True)


GPU_ANNOTATIONS = {
    "com.faas-gpu.slo-ms": "FAAS_GPU_SLO_MS",
    "com.faas-gpu.max-batch": "FAAS_GPU_MAX_BATCH",
    "com.faas-gpu.batch-timeout-ms": "FAAS_GPU_BATCH_TIMEOUT_MS",
    "com.faas-gpu.class": "FAAS_GPU_CLASS",
    # the model's name, carried by its jobs (X-Faas-Gpu-Model) for PROTEAN's slowdown specs;
    # protean-model when the name in PROTEAN's assumptions differs from the profiled one
    "com.faas-gpu.model": "FAAS_GPU_MODEL",
    "com.faas-gpu.protean-model": "FAAS_GPU_PROTEAN_MODEL",
}


def _gpu_settings(annotations: dict[str, str]) -> dict[str, str]:
    """The function's GPU settings (annotations, since faas-cli drops GPU limits) as the client's env."""
    return {env: annotations[key] for key, env in GPU_ANNOTATIONS.items() if key in annotations}


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _process_tree(pid: int) -> list[int]:
    pids, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for c in children:
            pids.append(int(c))
            frontier.append(int(c))
    return pids
