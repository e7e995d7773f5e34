"""Local-process runtime: each replica is a watchdog process on a free loopback port.

The supervision (restart with back-off, readiness, rolling replacement, crash-loop state) is
`supervisor.SupervisedRuntime`'s, shared with the Docker runtime; this module says how a replica
is a process: `launch` (a record as a command line and env), `isolation` (the sandbox it runs in:
its own uid and namespaces, its secrets at /var/openfaas/secrets, nothing of the state folder),
`processes` (start, probe, stop, measure, reap) and `output` (the function's log).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

from faas_gpu.contract import env as contract_env
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.imagestore import ImageStore
from faas_gpu.ports import free_port
from faas_gpu.sandbox.replica import Sandbox
from faas_gpu.schedulers import Directory
from faas_gpu.schedulers import merge as merge_schedulers

from ..logs import LogStore
from ..store import SecretStore
from ..types import FunctionRecord
from .base import InstanceSpec, Readiness, probe_readiness
from .cpu_usage import CpuRate
from .forkserver import ForkedProcess, ForkServer, NotReady, Unavailable, forkable, site_folders
from .isolation import Isolation, ReplicaFolders, Walls
from .launch import LaunchSpec, plan_launch
from .output import pump
from .pins import CpuPins, pin_tree
from .processes import (
    Replica,
    cpu_seconds,
    popen,
    reap_stale,
    rss_bytes,
    signal_group,
    stop_all,
)
from .replicas import FunctionReplicas
from .supervisor import SUPERVISE_EVERY_S, SupervisedRuntime

__all__ = ["SUPERVISE_EVERY_S", "LocalRuntime"]

log = logging.getLogger(__name__)


class LocalRuntime(SupervisedRuntime):
    def __init__(
        self,
        home: Path,
        images: ImageStore,
        secrets: SecretStore,
        logs: LogStore,
        gpu_env: dict[str, str] | None = None,
        schedulers: Directory | None = None,
        credentials: FunctionCredentials | None = None,
        pins: CpuPins | None = None,
        isolation: str = "auto",
        fork_server: bool | None = None,
    ):
        """`gpu_env`: how replicas reach the scheduler (GPU client); `credentials`: each function's
        own token for it (a file in its sandbox, FAAS_GPU_TOKEN_FILE), never the cluster token,
        which stays with the daemons; `pins`: the CPUs replicas are kept on (`pins`), None: not
        pinned; `isolation`: auto, on or off (FAAS_GPU_ISOLATION: `isolation.Walls.choose`);
        `fork_server`: fork isolated python3-gpu replicas from a template process (`forkserver`;
        None: FAAS_GPU_FORK_SERVER)."""
        super().__init__(logs)
        self.home = home
        self.walls = Walls.choose(home, isolation)
        self.gpu_env = dict(gpu_env or {})  # how replicas reach the scheduler (GPU client)
        self.schedulers = schedulers  # the replicas announced in the datastore, beside gpu_env's
        self.credentials = credentials
        self.images = images
        self.secrets = secrets
        self._cpu = CpuRate()
        self.pins = pins
        self.run_root = home / "run"
        reap_stale(self.run_root)
        if fork_server is None:
            fork_server = contract_env.FORK_SERVER.read()
        self.fork_server: ForkServer | None = None
        self._no_fork_server = "" if fork_server else f"{contract_env.FORK_SERVER.name}=off"
        if fork_server and not self.walls.isolation.isolated:
            self._no_fork_server = "replicas are not isolated (a forked replica gets its walls after the fork)"
        elif fork_server:
            self.fork_server = ForkServer(home / "forkserver")
        self._start_supervisor()

    # -- planning ------------------------------------------------------------------------
    def plan(self, record: FunctionRecord) -> LaunchSpec:
        spec = plan_launch(record, images=self.images, secrets=self.secrets, gpu_env=self.gpu_env)
        if self.fork_server is not None and forkable(spec) is None:
            self.fork_server.wanted()
        return spec

    def isolation(self) -> Isolation:
        if self.fork_server is not None:
            start = self.fork_server.describe()
        else:
            start = {"method": "exec", "reason": self._no_fork_server}
        return dataclasses.replace(self.walls.isolation, start=start)

    def usage(self, namespace: str, name: str) -> dict | None:
        fn = self._fns.get((namespace, name))
        if fn is None:
            return None
        replicas = list(fn.replicas)
        now = time.monotonic()
        cpu = self._cpu.millicores({r.id: (now, cpu_seconds(r), r.started) for r in replicas})
        return {"cpu": cpu, "totalMemoryBytes": float(rss_bytes(replicas))}

    # -- a replica as a process ------------------------------------------------------------
    def _tick(self) -> None:
        self._supersede_execd()
        super()._tick()

    def _supersede_execd(self) -> None:
        """Replicas exec'd only because the fork server was still starting (the first replica
        after the first python3-gpu deploy, always: the server imports torch meanwhile) are
        replaced by forked ones once it is ready, as in a rollout: the forked replica first, the
        exec'd one stopped once it is ready (`replicas.reconcile_count`). Why not wait for the
        server instead: the wait would hold the supervisor, and a server slower than the bound
        (a loaded node, a cold page cache) would still leave a replica of ~160 MB for good."""
        if self.fork_server is None:
            return
        with self._lock:
            execd = [r for fn in self._fns.values() for r in fn.replicas if r.fork_later and not r.superseded]
        if not execd or not self.fork_server.ready():
            return
        with self._lock:
            for r in execd:
                r.superseded = True
        log.info("fork server ready: replacing %d replica(s) exec'd while it started", len(execd))

    def _closing(self) -> None:
        if self.schedulers is not None:
            self.schedulers.close()
        if self.fork_server is not None:
            self.fork_server.close()

    def _exit_status(self, replica: Replica) -> str | None:
        code = replica.proc.poll()
        return None if code is None else f"exited with code {code}"

    def _reap(self, replica: Replica) -> None:
        signal_group(replica.proc, signal.SIGKILL)  # the leader died: so does its group
        shutil.rmtree(replica.run_dir, ignore_errors=True)
        self._unpin([replica])

    def _unpin(self, replicas: list[Replica]) -> None:
        for r in replicas:
            if self.pins is not None and r.cpus is not None:
                self.pins.give(r.cpus)
                r.cpus = None

    def _became_ready(self, replica: Replica) -> None:
        if replica.cpus is not None:  # threads started before `_popen` pinned the leader
            pin_tree(replica.proc.pid, replica.cpus)

    def _probe(self, replica: Replica) -> Readiness:
        return probe_readiness("127.0.0.1", replica.port)

    def _stop_all(self, replicas: list[Replica], timeout_s: float) -> None:
        self._unpin(replicas)  # now: a replica started while these drain may take their CPUs
        stop_all(replicas, timeout_s)

    def _spawn(self, fn: FunctionReplicas, inst: InstanceSpec | None = None, digest: str | None = None) -> Replica:
        record, spec = fn.record, fn.spec
        assert spec is not None
        rid = f"{inst.id if inst else record.name}-{uuid.uuid4().hex[:8]}"
        run_dir = self.run_root / record.namespace / rid
        try:
            return self._popen(record, spec, rid, run_dir, inst, digest)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise

    def _popen(
        self,
        record: FunctionRecord,
        spec: LaunchSpec,
        rid: str,
        run_dir: Path,
        inst: InstanceSpec | None,
        digest: str | None,
    ) -> Replica:
        uid = self.walls.uid_of(record.namespace, record.name)
        folders = ReplicaFolders.make(run_dir, uid)
        for secret in record.deployment.secrets or ():
            data = self.secrets.path(record.namespace, secret).read_bytes()
            folders.put(folders.secrets, secret, data, uid)
        token = bool(self.gpu_env and self.credentials is not None)
        if token:
            value = self.credentials.token(record.namespace, record.name)
            folders.put(folders.faas_gpu, "token", value.encode(), uid)
        port = free_port()
        env = self.walls.replica_env(folders, token)  # HOME, the token's file: the function's env may change HOME
        env.update(spec.env)
        if inst is not None:
            env.update(inst.env)
        env.update(port=str(port), HOSTNAME=rid)
        env[contract_env.FUNCTION.name] = record.name
        env[contract_env.NAMESPACE.name] = record.namespace
        url = contract_env.SCHEDULER_URL.name
        if env.get(url) and self.schedulers is not None:  # every scheduler
            env[url] = merge_schedulers(env[url], self.schedulers.urls())
        if spec.http_mode and "upstream_url" not in spec.env:
            env["upstream_url"] = f"http://127.0.0.1:{free_port()}"
        box = self.walls.sandbox_of(spec.argv, env, spec.cwd, folders, uid, spec.image)
        cpus = self.pins.take(_threads(env)) if self.pins is not None else None
        try:
            forked, fork_later = self._forked(spec, box, run_dir, port)
            proc = forked or popen(box, run_dir, port)
            if cpus is not None:
                pin_tree(proc.pid, cpus)  # it inherited the gateway's CPU; again once ready (`_became_ready`)
        except BaseException:
            if cpus is not None and self.pins is not None:
                self.pins.give(cpus)
            raise
        replica = Replica(rid, port, proc, run_dir, digest or spec.digest, slot=inst.id if inst else None, cpus=cpus)
        replica.fork_later = fork_later
        args = (self.logs, record.namespace, record.name, rid, proc)
        threading.Thread(target=pump, args=args, daemon=True).start()
        return replica

    def _forked(self, spec: LaunchSpec, box: Sandbox, run_dir: Path, port: int) -> tuple[ForkedProcess | None, bool]:
        """The replica forked by the fork server, or None: exec it (not a python3-gpu replica, or
        the server is starting, restarting or refused; the provider's log says why); and whether
        it is exec'd only because the server is not ready yet (`fork_later`: replaced once it is)."""
        if self.fork_server is None or forkable(spec) is not None:
            return None, False
        try:
            proc = self.fork_server.spawn(box, site_folders(spec.argv[0]))
        except Unavailable as exc:
            log.info("replica %s exec'd: %s", run_dir.name, exc)
            return None, isinstance(exc, NotReady)
        (run_dir / "pid").write_text(str(proc.pid))
        (run_dir / "port").write_text(str(port))
        return proc, False


def _threads(env: dict[str, str]) -> int:
    """CPUs a replica is pinned to: the torch threads its instance was given, else one."""
    try:
        return max(1, contract_env.CPU_THREADS.read(env) or 1)
    except ValueError:
        return 1
