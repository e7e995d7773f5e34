"""Local-process runtime: each replica is a watchdog process on a free loopback port.

A supervisor thread restarts crashed replicas (with back-off), probes `/_/ready` until a new
replica serves, and keeps the count at the record's desired replicas. Whatever goes wrong with
one function (a spec that no longer plans, a start that raises, replicas that crash-loop) is
that function's state, backed off and shown by `describe`; the others keep starting and serving.
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
from faas_gpu.schedulers import Directory
from faas_gpu.schedulers import merge as merge_schedulers

from ..config import parse_duration
from ..logs import LogStore
from ..store import SecretStore
from ..types import FunctionRecord
from .base import InstanceSpec, LaunchError, Runtime

log = logging.getLogger(__name__)

CLASSIC_WATCHDOG = paths.TEMPLATES_DIR / "python3-gpu" / "fwatchdog.py"
PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "OMP_NUM_THREADS", "PYTHONPATH")
MAX_BACKOFF_S = 60.0
SUPERVISE_EVERY_S = 0.1
MAX_ARG_STRLEN = 131072  # Linux: one exec argument or environment string (`fprocess=...`)
DEFAULT_STOP_TIMEOUT_S = 35.0  # the default write_timeout (30 s) and 5 s to exit
CRASH_LOOP_EXITS = 3
"""Exits in a row without a replica becoming ready: the function is crash-looping and
requests get a prompt 503 instead of waiting for a replica that will not come."""
CRASH_LOOPING = "CrashLooping"
START_FAILED = "StartFailed"


def backoff_s(failures: int) -> float:
    """0.5 s after the first failure, doubling, at most MAX_BACKOFF_S."""
    return min(MAX_BACKOFF_S, 0.5 * 2 ** min(max(failures - 1, 0), 16))


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
    spec: LaunchSpec | None
    """None while the record does not plan (missing image or secret): retried with back-off."""
    replicas: list[Replica] = field(default_factory=list)
    failures: int = 0
    """Failed starts and exits since a replica last became ready: the back-off's exponent."""
    exits: int = 0
    """Replica exits since a replica last became ready: the crash-loop count."""
    next_start: float = 0.0
    plan: list[InstanceSpec] | None = None
    """When set, the replicas are exactly these instances (and record.replicas is ignored)."""
    start_error: str | None = None
    """Why the last attempt to plan or start a replica failed (cleared by the next success)."""

    @property
    def problem(self) -> dict[str, str] | None:
        """The function's faas-gpu state when it cannot serve for a reason of its own."""
        if self.start_error is not None:
            return {"state": START_FAILED, "message": self.start_error}
        if self.exits >= CRASH_LOOP_EXITS and not any(r.ready for r in self.replicas):
            ref = f"{self.record.name}.{self.record.namespace}"
            return {
                "state": CRASH_LOOPING,
                "message": (
                    f"function {ref} is crash-looping: its replicas exited {self.exits} times in a row "
                    f"before serving; see `faas-gpu logs {self.record.name}` or /system/logs?name={ref}"
                ),
            }
        return None


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
        if dep.envProcess and len(dep.envProcess.encode()) >= MAX_ARG_STRLEN - len("fprocess="):
            # checked before shlex, which is quadratic in the length (minutes for 3 MB)
            raise LaunchError(
                f"envProcess: {len(dep.envProcess.encode())} bytes is over Linux's limit of "
                f"{MAX_ARG_STRLEN} bytes for one argument or environment string"
            )
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
        """Take the record as desired state. A record that does not plan is still kept (its
        state shows why, and the supervisor retries it); the error is raised for the caller."""
        try:
            spec: LaunchSpec | None = self.plan(record)
            error = None
        except Exception as exc:  # noqa: BLE001 — any bad record is its own function's problem
            spec, error = None, _reason(exc)
        with self._lock:
            fn = self._fns.get(record.key)
            if fn is None:
                fn = self._fns[record.key] = _Function(record, spec, plan=self._plans.get(record.key))
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
            self._stop_all(fn.replicas, _stop_timeout(fn))

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
        if self.schedulers is not None:
            self.schedulers.close()
        with self._lock:
            fns = list(self._fns.values())
            self._fns.clear()
            self._changed.notify_all()
        threads = [threading.Thread(target=self._stop_all, args=(fn.replicas, _stop_timeout(fn))) for fn in fns]
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
                    self._failed(fn, _reason(exc), time.monotonic())
                    self._changed.notify_all()

    def _tick_one(self, fn: _Function, now: float) -> None:
        to_stop: list[Replica] = []
        with self._lock:
            for r in list(fn.replicas):
                code = r.proc.poll()
                if code is not None and not r.stopping:
                    fn.replicas.remove(r)
                    _signal_group(r.proc, signal.SIGKILL)  # the leader died: so does its group
                    fn.failures += 1
                    fn.exits += 1
                    fn.next_start = now + backoff_s(fn.failures)
                    self._log(fn, r.id, f"replica exited with code {code}")
                    if fn.exits == CRASH_LOOP_EXITS:
                        self._log(fn, r.id, fn.problem["message"] if fn.problem else "crash-looping")
                        log.warning("%s.%s is crash-looping", fn.record.name, fn.record.namespace)
                        self._changed.notify_all()  # waiting requests give up now
                    shutil.rmtree(r.run_dir, ignore_errors=True)
            if fn.spec is None:
                if now < fn.next_start:
                    return
                try:
                    fn.spec = self.plan(fn.record)
                except Exception as exc:  # noqa: BLE001
                    self._failed(fn, _reason(exc), now)
                    return
            if fn.plan is not None:
                to_stop += self._reconcile_plan(fn, now)
            else:
                to_stop += self._reconcile_count(fn, now)
            if to_stop:
                self._changed.notify_all()
        spec = fn.spec
        if to_stop:
            threading.Thread(target=self._stop_all, args=(to_stop, spec.stop_timeout_s), daemon=True).start()
        for r in [r for r in fn.replicas if not r.ready and r.proc.poll() is None]:
            if self._probe(r, spec.http_mode):
                with self._lock:
                    r.ready = True
                    fn.failures = fn.exits = 0
                    self._changed.notify_all()

    def _failed(self, fn: _Function, error: str, now: float) -> None:
        """A plan or start of `fn` failed: back off, and say so once per change of reason."""
        fn.failures += 1
        fn.next_start = now + backoff_s(fn.failures)
        if error != fn.start_error:
            log.error(
                "%s.%s cannot start (retrying with back-off): %s", fn.record.name[:80], fn.record.namespace, error
            )
            self._log(fn, "supervisor", f"cannot start: {error}")
        fn.start_error = error

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
                if not self._try_start(fn, now):
                    break
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
            if not current and now >= fn.next_start and not self._try_start(fn, now, inst, digests[slot]):
                break
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

    def _try_start(
        self, fn: _Function, now: float, inst: InstanceSpec | None = None, digest: str | None = None
    ) -> bool:
        """Start one replica; a failure (ENAMETOOLONG, E2BIG, a vanished image) backs `fn` off."""
        try:
            fn.replicas.append(self._start(fn, inst, digest))
        except Exception as exc:  # noqa: BLE001 — any failure is this function's alone
            self._failed(fn, _reason(exc), now)
            return False
        fn.start_error = None
        return True

    def _start(self, fn: _Function, inst: InstanceSpec | None = None, digest: str | None = None) -> Replica:
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
            FAAS_GPU_FUNCTION=record.name,
            FAAS_GPU_PARENT_PID=str(os.getpid()),  # the watchdog dies with this provider
            FAAS_GPU_NAMESPACE=record.namespace,
        )
        if env.get("FAAS_GPU_SCHEDULER_URL") and self.schedulers is not None:  # every scheduler
            env["FAAS_GPU_SCHEDULER_URL"] = merge_schedulers(env["FAAS_GPU_SCHEDULER_URL"], self.schedulers.urls())
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
        try:
            self.logs.append(fn.record.namespace, fn.record.name, rid, text)
        except OSError as exc:  # a name the file system refuses: the provider's own log has it
            log.warning(
                "%s.%s (%s): %s [function log not written: %s]",
                fn.record.name[:80],
                fn.record.namespace,
                rid,
                text,
                exc.strerror,
            )

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


def _stop_timeout(fn: _Function) -> float:
    return fn.spec.stop_timeout_s if fn.spec is not None else DEFAULT_STOP_TIMEOUT_S


def _reason(exc: BaseException) -> str:
    """One line for describe and the logs (an OSError's path can be kilobytes long)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 500 else text[:500] + "…"


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
