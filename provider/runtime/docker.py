"""Docker runtime (`--runtime docker`): each replica is a container of the function's image.

Containers run on the host network (`network_mode=host`), each replica's watchdog on a port of
its own, so the gateway reaches a replica at http://127.0.0.1:<port> exactly as it reaches a
process replica, and a function's GPU client reaches the scheduler at the address the stack
gives it. The supervision (restart with back-off, readiness through the watchdog's `/_/ready`,
rolling replacement, crash-loop state, INFless per-instance plans) is
`supervisor.SupervisedRuntime`'s, shared with the process runtime; this module says how a
replica is a container (`containers` holds the pure spec).

Decisions:
- Logs: one thread per replica follows the engine's log stream (`docker logs -f`) into the
  provider's LogStore, so `faas-cli logs`/`faas-gpu logs` read containers' output as they read
  processes'; when the stream ends the thread waits for the exit and inspects the container:
  an exit code, or `State.OOMKilled` (the function went over `limits.memory`), which goes to the
  function's log and to `describe` (state OOMKilled) until the function is deployed again.
- Restart policy "no": the supervisor restarts, so back-off and crash-loop state are ours.
- Close: the containers are stopped and removed, as the process runtime stops its processes, and
  a provider that starts removes what one before it (same state folder: the `owner` label) left
  behind. faasd keeps function containers across a restart of its provider, because containerd
  is its only record of them; here the datastore is, and a restarted provider starts the
  replicas again from it (`Provider.restore`), so a crash leaves no replica nobody supervises.
- Secrets: the function's secrets are copied from the SecretStore into a folder per replica
  (`<home>/containers/<namespace>/<replica>/secrets`, files 0644 so the image's non-root user
  reads them) and bind-mounted read-only at /var/openfaas/secrets; its token likewise, in a folder
  of its own (`.../faas-gpu/token`) mounted read-only at /var/openfaas/faas-gpu, never in its
  environment. Nothing else of the host is mounted. The engine must see the same path as the
  provider: run the provider on the engine's host, or mount its state folder at the same path (as
  faasd's /var/lib/faasd-provider).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from faas_gpu.contract import env as contract_env
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.ports import free_port
from faas_gpu.schedulers import Directory
from faas_gpu.schedulers import merge as merge_schedulers

from ..logs import LogStore
from ..store import SecretStore
from ..types import FunctionRecord
from .base import InstanceSpec, LaunchError, Readiness, probe_readiness
from .containers import LABEL_OWNER, TOKEN_NAME, ContainerPlan, plan_container, replica_container
from .cpu_usage import CpuRate, container_cpu_seconds
from .launch import check_record
from .output import note
from .replicas import FunctionReplicas
from .supervisor import SupervisedRuntime

log = logging.getLogger(__name__)

OOM_KILLED = "OOMKilled"


def owner_of(home: Path) -> str:
    """The `com.faas-gpu.owner` label of the containers a provider with this state folder runs:
    several stacks may share one engine, and each reaps only its own leftovers."""
    return hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:12]


@dataclass
class ContainerReplica:
    id: str
    port: int
    container_id: str
    run_dir: Path
    digest: str
    key: tuple[str, str]
    slot: str | None = None
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    stopping: bool = False
    ended: str | None = None
    """How the container ended (set by its log thread once the engine says it exited)."""
    oom_noted: bool = False
    """An OOM kill in it was reported already (the engine's oom event, before or without an exit)."""
    superseded: bool = False
    """Replaced as a replica of an older version is (`replicas.reconcile_count`); never set here."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class DockerRuntime(SupervisedRuntime):
    def __init__(
        self,
        home: Path,
        secrets: SecretStore,
        logs: LogStore,
        gpu_env: dict[str, str] | None = None,
        schedulers: Directory | None = None,
        credentials: FunctionCredentials | None = None,
        *,
        docker_host: str | None = None,
        client: docker.DockerClient | None = None,
    ):
        """`docker_host`: the engine's address (unix:///var/run/docker.sock, tcp://...); None:
        DOCKER_HOST or the default socket, as the docker CLI finds it."""
        super().__init__(logs)
        self.home = Path(home)
        self.secrets = secrets
        self.gpu_env = dict(gpu_env or {})
        self.schedulers = schedulers
        self.credentials = credentials
        try:
            if client is not None:
                self.client = client
            elif docker_host:
                self.client = docker.DockerClient(base_url=docker_host, version="auto", max_pool_size=64)
            else:
                self.client = docker.from_env(version="auto", max_pool_size=64)
            self.client.ping()
        except DockerException as exc:
            raise RuntimeError(f"--runtime docker: cannot reach the Docker engine ({exc})") from None
        self.api = self.client.api
        self._cpu = CpuRate()
        self.run_root = self.home / "containers"
        self.owner = owner_of(self.home)
        self._ooms: dict[tuple[str, str], str] = {}
        self._events = None
        self._reap_stale()
        self._start_supervisor()
        threading.Thread(target=self._watch_ooms, name="docker-oom-events", daemon=True).start()

    # -- planning ------------------------------------------------------------------------
    def plan(self, record: FunctionRecord) -> ContainerPlan:
        stop_timeout = check_record(record, self.secrets)
        image = record.deployment.image
        try:
            image_id = self.api.inspect_image(image)["Id"]
        except ImageNotFound:
            raise LaunchError(
                f"image: {image!r} is not in the Docker engine; build it with `faas-gpu build --docker` "
                "(or `faas-cli build`), or pull/push it so this engine has it, then deploy again"
            ) from None
        token = None
        if self.gpu_env and self.credentials is not None:
            token = self.credentials.token(record.namespace, record.name)
        return plan_container(
            record, image_id=image_id, owner=self.owner, stop_timeout_s=stop_timeout, gpu_env=self.gpu_env, token=token
        )

    def apply(self, record: FunctionRecord) -> None:
        fn = self._fns.get(record.key)
        if fn is not None and fn.record.deployment.to_json() != record.deployment.to_json():
            self._ooms.pop(record.key, None)  # a new spec (a bigger limit?) starts with a clean slate
        super().apply(record)

    def remove(self, namespace: str, name: str) -> None:
        self._ooms.pop((namespace, name), None)
        super().remove(namespace, name)

    def problem(self, namespace: str, name: str) -> dict[str, str] | None:
        """The supervisor's state, else the last OOM kill since the function was deployed."""
        found = super().problem(namespace, name)
        if found is not None:
            return found
        oom = self._ooms.get((namespace, name))
        if not oom:
            return None
        serving = len(self.endpoints(namespace, name))
        if serving:  # it serves again (restarted, or a fork died and the watchdog lives): the OOM stays visible
            oom += f" ({serving} replica{'s' if serving > 1 else ''} serving)"
        return {"state": OOM_KILLED, "message": oom}

    def usage(self, namespace: str, name: str) -> dict | None:
        """The replicas' memory as the engine counts it (cgroup usage less page cache), and their
        CPU in millicores since the last reading (`cpu_usage.py`)."""
        fn = self._fns.get((namespace, name))
        if fn is None:
            return None
        total, cpu = 0, {}
        for r in list(fn.replicas):
            try:
                stats = self.api.stats(r.container_id, stream=False, one_shot=True)
            except DockerException:
                continue
            mem = stats.get("memory_stats") or {}
            cache = (mem.get("stats") or {}).get("inactive_file", 0)
            total += max(0, int(mem.get("usage", 0)) - int(cache))
            cpu[r.container_id] = (time.monotonic(), container_cpu_seconds(stats), r.started)
        return {"cpu": self._cpu.millicores(cpu), "totalMemoryBytes": float(total)}

    # -- a replica as a container ----------------------------------------------------------
    def _closing(self) -> None:
        if self.schedulers is not None:
            self.schedulers.close()
        events = self._events
        if events is not None:
            with contextlib.suppress(Exception):
                events.close()

    def _watch_ooms(self) -> None:
        """The engine's `oom` events for this provider's containers: a process killed for going
        over the limit where the container lives on (a classic-mode fork: the watchdog answers
        500 and serves on) is reported as one that exits is."""
        while not self._closed.is_set():
            try:
                self._events = self.api.events(
                    decode=True, filters={"event": "oom", "label": f"{LABEL_OWNER}={self.owner}"}
                )
                for event in self._events:
                    self._oom_event(str(event.get("id") or (event.get("Actor") or {}).get("ID") or ""))
            except Exception as exc:  # noqa: BLE001 — the engine went away: watch again when it is back
                if not self._closed.is_set():
                    log.warning("docker oom events: %s", exc)
            self._closed.wait(1.0)

    def _oom_event(self, container_id: str) -> None:
        with self._lock:
            found = [(fn, r) for fn in self._fns.values() for r in fn.replicas if r.container_id == container_id]
        for fn, r in found:
            self._report_oom(fn.record, r)

    def _report_oom(self, record: FunctionRecord, r: ContainerReplica) -> None:
        if r.oom_noted or r.stopping:
            return
        r.oom_noted = True
        limit = (record.deployment.limits or {}).get("memory")
        message = (
            f"replica {r.id} was OOM-killed: it went over its memory limit"
            f"{f' (limits.memory {limit})' if limit else ''}; raise limits.memory or use less"
        )
        self._ooms[record.key] = message
        note(self.logs, record, r.id, message)
        log.warning("%s.%s: %s", record.name, record.namespace, message)

    def _spawn(
        self, fn: FunctionReplicas, inst: InstanceSpec | None = None, digest: str | None = None
    ) -> ContainerReplica:
        record, plan = fn.record, fn.spec
        assert isinstance(plan, ContainerPlan)
        rid = f"{record.name}-{inst.id + '-' if inst else ''}{uuid.uuid4().hex[:8]}"[:120]
        run_dir = self.run_root / record.namespace / rid
        secrets_dir = run_dir / "secrets"
        token_dir = run_dir / "faas-gpu"
        for folder in (secrets_dir, token_dir):
            folder.mkdir(parents=True)
            os.chmod(folder, 0o755)  # whatever the provider's umask: the mount's root, read by the image's user
        try:
            for secret in plan.secrets:
                dest = secrets_dir / secret
                shutil.copyfile(self.secrets.path(record.namespace, secret), dest)
                os.chmod(dest, 0o644)  # the image's user (app) reads it; the state folder above is 0700
            if plan.token:
                (token_dir / TOKEN_NAME).write_text(plan.token)
                os.chmod(token_dir / TOKEN_NAME, 0o644)
            extra: dict[str, str] = {}
            url = contract_env.SCHEDULER_URL.name
            if plan.env.get(url) and self.schedulers is not None:  # every scheduler
                extra[url] = merge_schedulers(plan.env[url], self.schedulers.urls())
            spec = replica_container(
                plan,
                replica_id=rid,
                port=free_port(),
                upstream_port=free_port(),
                digest=digest,
                instance=inst,
                secrets_source=str(secrets_dir.resolve()),
                token_source=str(token_dir.resolve()),
                extra_env=extra,
            )
            container = self.client.containers.create(**spec.create_kwargs())
            replica = ContainerReplica(
                rid, spec.port, container.id, run_dir, digest or plan.digest, record.key, slot=inst.id if inst else None
            )
            try:
                container.start()
            except BaseException:
                self._remove_container(container.id)
                raise
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        threading.Thread(target=self._follow, args=(record, replica), daemon=True).start()
        return replica

    def _follow(self, record: FunctionRecord, r: ContainerReplica) -> None:
        """Copy the container's output into the function's log until it exits, then say how it ended."""
        partial = b""
        try:
            for chunk in self.api.logs(r.container_id, stream=True, follow=True, stdout=True, stderr=True):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for line in lines:
                    self.logs.append(record.namespace, record.name, r.id, line.decode("utf-8", "replace"))
            if partial:
                self.logs.append(record.namespace, record.name, r.id, partial.decode("utf-8", "replace"))
            self.api.wait(r.container_id)
            state = self.api.inspect_container(r.container_id)["State"]
        except NotFound:
            r.ended = "was removed from the engine"
            return
        except Exception as exc:  # noqa: BLE001 — an engine that went away: the replica is gone too
            if not r.stopping:
                log.warning("%s: lost the engine's log stream: %s", r.id, exc)
            r.ended = f"was lost: {exc}"
            return
        if state.get("OOMKilled"):
            self._report_oom(record, r)
            r.ended = f"was OOM-killed (exit code {state.get('ExitCode')})"
        else:
            r.ended = f"exited with code {state.get('ExitCode')}"

    def _exit_status(self, replica: ContainerReplica) -> str | None:
        return replica.ended

    def _reap(self, replica: ContainerReplica) -> None:
        self._remove_container(replica.container_id)
        shutil.rmtree(replica.run_dir, ignore_errors=True)

    def _probe(self, replica: ContainerReplica) -> Readiness:
        return probe_readiness("127.0.0.1", replica.port)

    def _stop_all(self, replicas: list[ContainerReplica], timeout_s: float) -> None:
        """SIGTERM each (the watchdog drains), the engine kills what is left after timeout_s."""
        for r in replicas:
            r.stopping = True
        threads = [threading.Thread(target=self._stop_one, args=(r, timeout_s)) for r in replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _stop_one(self, r: ContainerReplica, timeout_s: float) -> None:
        try:
            self.api.stop(r.container_id, timeout=max(1, int(timeout_s)))
        except NotFound:
            pass
        except DockerException as exc:
            log.warning("%s: stop failed: %s", r.id, exc)
        self._reap(r)

    def _remove_container(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True)
        except NotFound:
            pass
        except APIError as exc:
            if exc.status_code != 409:  # removal already in progress
                log.warning("%s: remove failed: %s", container_id[:12], exc)
        except DockerException as exc:
            log.warning("%s: remove failed: %s", container_id[:12], exc)

    def _reap_stale(self) -> None:
        """Remove the containers a provider with this state folder left (it crashed or was killed)."""
        try:
            stale = self.api.containers(all=True, filters={"label": f"{LABEL_OWNER}={self.owner}"})
        except DockerException as exc:
            log.warning("cannot list leftover containers: %s", exc)
            return
        for c in stale:
            self._remove_container(c["Id"])
        shutil.rmtree(self.run_root, ignore_errors=True)
