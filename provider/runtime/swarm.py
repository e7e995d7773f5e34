"""Swarm runtime: each function instance a Docker Swarm service on the nodes' host network.

Why one service per instance (not one service with N replicas): functions run on the host
network of their node (no overlay or ingress, so no traffic leaves the hosts' own network and the
gateway reaches a replica at its node's address), so two replicas on one node need different
watchdog ports. Swarm templates (`{{.Task.Slot}}`) can put the slot in an env value but cannot
do arithmetic on it, and an image's own command line is not known to the manager (the image may
be in a registry only), so a per-replica port cannot be derived inside the task. One service per
instance gets its port from this runtime instead (cluster-unique, recorded in the service's
labels so a restarted provider recovers them), and the same mechanism runs INFless's and
HarmonyBatch's non-uniform plans (`set_plan`: one service per planned instance, its own env).
Swarm still does what an engine is for: it places each service by the function's constraints,
pulls the image from the registry on the node, restarts a crashed task, and reschedules the
tasks of a node that is lost.

Networks: by default the services run on their node's host network (what the tests run: no
overlay, replicas at <node address>:<port>, the scheduler and the GPU Managers reached at the node
addresses they announce). `network=` (`--swarm-network`) attaches them to an attachable overlay
instead, the gateway on it too (deploy/swarm-stack.yml: `faas-gpu`): a replica is then reached at
its task's address on that network, and the daemons announce their overlay addresses.

A supervisor thread reconciles services with the desired state (create what is missing, remove
what is extra, replace a stale instance one at a time while the others serve: a rolling update),
reads the running tasks (node address + the instance's port) and probes each watchdog's
`/_/ready`; endpoints are the ready ones on nodes Swarm calls ready. A task that Swarm rejects
(no such image, no node satisfies the constraints) or that keeps failing is the function's
`problem()`, shown by describe and answered 503 at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faas_gpu.contract import env as contract_env
from faas_gpu.contract import labels as runtime_labels
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.schedulers import Directory
from faas_gpu.schedulers import merge as merge_schedulers

from ..logs import LogStore
from ..store import SecretStore
from ..types import FunctionRecord
from . import containers
from .base import InstanceSpec, LaunchError, Readiness, WatchedRuntime, probe_readiness
from .containers import LABEL_DIGEST, LABEL_FUNCTION, LABEL_NAMESPACE, LABEL_OWNER, LABEL_PORT, SECRETS_PATH
from .cpu_usage import CpuRate, container_cpu_seconds
from .launch import check_record

log = logging.getLogger(__name__)

LABEL_INSTANCE = runtime_labels.INSTANCE  # the service's instance id (r0.., or an INFless plan's)
LABEL_ENGINE = runtime_labels.ENGINE  # a node label: that node's own Engine API address
ENGINE_TIMEOUT_S = 3.0  # a node's engine asked for a task's stats: a lost node must not hold describe
PORT_RANGE = (20000, 29998)  # even ports: P is the watchdog's, P+1 the http-mode function's
SUPERVISE_EVERY_S = 0.5
FAILED_STATES = ("failed", "rejected")
ADOPT_GRACE_S = 30.0  # after a start, services of functions not yet restored are kept
CRASH_LOOP_FAILURES = 3  # failed tasks in the service's history (Swarm keeps 5) with none running
HEALTH_INTERVAL_S = 0.25
"""The task's health check interval (the image's own check, e.g. the template's lock file): Swarm
reports a task with a health check running only once it is healthy, and the template's 3 s would
add up to 3 s to every cold start."""


@dataclass
class _Function:
    record: FunctionRecord
    plan: list[InstanceSpec] | None = None
    problem: dict[str, str] | None = None
    ready: dict[str, str] = field(default_factory=dict)  # instance id -> URL of a ready replica
    rollout: dict[str, Any] | None = None


def _rollout(name: str, want: int, rolling: int, ready: int, problem: dict[str, str] | None) -> dict[str, Any]:
    """faasGpuRollout while instances still run an older spec (one is replaced at a time, and only
    once its successor serves): Stalled with the new replicas' trouble, else Progressing."""
    out: dict[str, Any] = {"state": "Stalled" if problem else "Progressing", "replicas": want, "oldReplicas": rolling}
    if problem:
        out["message"] = (
            f"the new version's replicas are not ready: {problem.get('message', '')}; {ready} of {want} "
            f"instances serve, the previous version's where not replaced; `faas-gpu rollback {name}` "
            "(or deploying the previous spec again) restores it"
        )
    else:
        out["message"] = f"{want - rolling} of {want} instances on the new version; {ready} serving"
    return out


def swarm_resources(record: FunctionRecord) -> dict[str, int]:
    """OpenFaaS `limits`/`requests` (parsed once, by containers.py) as a Swarm task's resources:
    memory in bytes, CPU in nano-CPUs (Swarm has no CPU shares: `requests.cpu` is a reservation,
    which also keeps the scheduler from placing more than a node has)."""
    dep = record.deployment
    r = containers.resources(dep.limits, dep.requests)
    out: dict[str, int] = {}
    if r.mem_limit is not None:
        out["mem_limit"] = r.mem_limit
    if r.mem_reservation is not None:
        out["mem_reservation"] = r.mem_reservation
    if r.nano_cpus is not None:
        out["cpu_limit"] = r.nano_cpus
    if (dep.requests or {}).get("cpu"):
        out["cpu_reservation"] = int(containers.cpus("requests.cpu", dep.requests["cpu"]) * containers.NANO)
    return out


def _task_started(task: dict) -> float:
    """When the task reached its state (running), as a Unix time; now when the engine did not say."""
    from ..logs import parse_time

    try:
        return parse_time(task["Status"]["Timestamp"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return time.time()


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _service_name(record: FunctionRecord, instance: str, digest: str) -> str:
    """A Swarm service name (63 characters of [a-zA-Z0-9-]) unique per namespace, function,
    instance and spec, so a replacement can start before the instance it replaces is gone."""
    base = re.sub(r"[^a-zA-Z0-9-]", "-", f"{record.name}-{instance}")[:40].strip("-")
    return f"{base}-{_digest(record.namespace, record.name, instance, digest)[:8]}"


def node_address(node: dict) -> str | None:
    """The address a node's host-network ports are reached at: Status.Addr (managers may report
    0.0.0.0 there, then ManagerStatus.Addr without its port)."""
    addr = (node.get("Status") or {}).get("Addr") or ""
    if addr in ("", "0.0.0.0"):
        addr = ((node.get("ManagerStatus") or {}).get("Addr") or "").rpartition(":")[0]
    return addr or None


def probe(url: str, timeout_s: float = 0.5) -> Readiness:
    """The replica's `/_/ready` (true when ready; `failed` says why it never will be)."""
    host, _, port = url.removeprefix("http://").partition(":")
    return probe_readiness(host, int(port), timeout_s)


def engine_client(base_url: str) -> Any:
    """A docker SDK client on one node's Engine API (`com.faas-gpu.engine`), with the TLS settings
    of the environment (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) as the manager's client has them."""
    import docker

    env = {**os.environ, "DOCKER_HOST": base_url}
    return docker.from_env(environment=env, version="auto", timeout=ENGINE_TIMEOUT_S)


class SwarmRuntime(WatchedRuntime):
    def __init__(
        self,
        client: Any,
        secrets: SecretStore,
        logs: LogStore,
        gpu_env: dict[str, str] | None = None,
        schedulers: Directory | None = None,
        credentials: FunctionCredentials | None = None,
        *,
        stack: str = "faas-gpu",
        network: str | None = None,
        supervise_every_s: float = SUPERVISE_EVERY_S,
        engines: Callable[[str], Any] = engine_client,
    ):
        """`client`: a docker SDK DockerClient on a Swarm manager. `gpu_env`: how replicas reach
        the scheduler (an address every node can reach, not loopback); `credentials`: each
        function's own token (a Swarm secret, FAAS_GPU_TOKEN_FILE). `stack` labels this provider's services, so two
        stacks on one swarm keep apart. `engines`: a client on a node's own engine, given the
        address its `com.faas-gpu.engine` label names (usage of the tasks on that node)."""
        self.client, self.api = client, client.api
        self._cpu = CpuRate()
        self.secrets, self.logs = secrets, logs
        self.gpu_env = dict(gpu_env or {})
        self.schedulers, self.credentials = schedulers, credentials
        self.stack = stack
        self.network = network  # None: the nodes' host network; else an overlay (see _task_url)
        self.every_s = supervise_every_s
        self._fns: dict[tuple[str, str], _Function] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._secret_ids: dict[str, str] = {}
        self._following: set[str] = set()  # services whose logs a thread copies into the log store
        self._engines: Callable[[str], Any] = engines
        self._engine_clients: dict[str, Any] = {}  # a node's engine address -> its client
        self._started_at = time.monotonic()
        self._supervisor = threading.Thread(target=self._supervise, name="swarm-supervisor", daemon=True)
        self._supervisor.start()

    # -- desired state -------------------------------------------------------------------
    def check(self, record: FunctionRecord) -> None:
        dep = record.deployment
        if not dep.image:
            raise LaunchError("image: is required for the swarm runtime")
        check_record(record, self.secrets)
        swarm_resources(record)
        containers.labels(record, self.stack)  # a label clashing with an annotation's is refused
        for c in dep.constraints or ():
            if not re.match(r"^\s*[\w.\-]+\s*(==|!=)\s*\S.*$", c):
                raise LaunchError(f"constraints: {c!r} is not a Swarm constraint such as node.labels.gpu==true")

    def apply(self, record: FunctionRecord) -> None:
        self.check(record)
        with self._lock:
            fn = self._fns.get(record.key)
            if fn is None:
                self._fns[record.key] = _Function(record)
            else:
                fn.record, fn.problem = record, None
            self._changed.notify_all()

    def set_plan(self, namespace: str, name: str, plan: list[InstanceSpec] | None) -> None:
        with self._lock:
            fn = self._fns.get((namespace, name))
            if fn is not None:
                fn.plan = None if plan is None else list(plan)
            self._changed.notify_all()

    def remove(self, namespace: str, name: str) -> None:
        with self._lock:
            self._fns.pop((namespace, name), None)
            self._changed.notify_all()
        for svc in self._services(namespace, name):
            self._remove_service(svc["ID"])

    # -- what runs -----------------------------------------------------------------------
    def endpoints(self, namespace: str, name: str) -> list[str]:
        return [url for _, url in self.ready_instances(namespace, name)]

    def ready_instances(self, namespace: str, name: str) -> list[tuple[str, str]]:
        fn = self._fns.get((namespace, name))
        return sorted(fn.ready.items()) if fn is not None else []

    def instances(self, namespace: str, name: str) -> list[str]:
        return sorted(s["Spec"]["Labels"].get(LABEL_INSTANCE, "") for s in self._services(namespace, name))

    def placement(self, namespace: str, name: str) -> dict[str, str]:
        """Instance id -> the hostname of the node its running task is on (tests, benchmarks)."""
        nodes = {n["ID"]: n["Description"]["Hostname"] for n in self.api.nodes()}
        out = {}
        for svc in self._services(namespace, name):
            for t in self.api.tasks(filters={"service": svc["ID"], "desired-state": "running"}):
                if t["Status"]["State"] == "running":
                    out[svc["Spec"]["Labels"][LABEL_INSTANCE]] = nodes.get(t.get("NodeID"), "?")
        return out

    def usage(self, namespace: str, name: str) -> dict | None:
        """Memory of the function's running tasks as their engines count it (cgroup usage less
        page cache), and their CPU in millicores since the last reading (`cpu_usage.py`). The
        Engine API gives a container's stats only on the node that runs it: a task on the
        manager's node is read through this provider's engine, a task elsewhere through its node's
        engine at the address the node's `com.faas-gpu.engine` label names. A running task that
        cannot be read is listed in `faasGpuUnmeasured` ({instance, node, reason}: no label on its
        node, its node down, its engine not answering) beside the total
        of those that were; None when no task runs."""
        if (namespace, name) not in self._fns:
            return None
        try:
            here = self.api.info()["Swarm"]["NodeID"]
            nodes = {n["ID"]: n for n in self.api.nodes()}
        except Exception:  # noqa: BLE001 — no engine, no figure
            return None
        total, counted, unmeasured, cpu = 0, 0, [], {}
        down: dict[str, str] = {}  # engine address -> why it did not answer, once per call
        for svc in self._services(namespace, name):
            instance = svc["Spec"]["Labels"].get(LABEL_INSTANCE, "")
            for t in self.api.tasks(filters={"service": svc["ID"], "desired-state": "running"}):
                cid = ((t.get("Status") or {}).get("ContainerStatus") or {}).get("ContainerID")
                if not cid or t["Status"]["State"] != "running":
                    continue
                node = nodes.get(t.get("NodeID", "")) or {}
                host = (node.get("Description") or {}).get("Hostname") or t.get("NodeID", "?")
                stats, reason = self._task_stats(cid, t.get("NodeID") == here, node, down)
                if stats is None:
                    unmeasured.append({"instance": instance, "node": host, "reason": reason})
                    continue
                mem = stats.get("memory_stats") or {}
                cache = (mem.get("stats") or {}).get("inactive_file", 0)
                total, counted = total + max(0, int(mem.get("usage", 0)) - int(cache)), counted + 1
                cpu[cid] = (time.time(), container_cpu_seconds(stats), _task_started(t))
        if not counted and not unmeasured:
            return None
        out: dict[str, Any] = {"cpu": self._cpu.millicores(cpu), "totalMemoryBytes": float(total)}
        if unmeasured:
            out["faasGpuUnmeasured"] = sorted(unmeasured, key=lambda u: (u["instance"], u["node"]))
        return out

    def _task_stats(self, cid: str, local: bool, node: dict, down: dict[str, str]) -> tuple[dict | None, str]:
        """(the container's stats, "") from the engine of the node it runs on, or (None, why not)."""
        hostname = (node.get("Description") or {}).get("Hostname", "?")
        if local:
            api, address = self.api, None
        else:
            state = (node.get("Status") or {}).get("State", "unknown")
            if state != "ready":
                return None, f"node {hostname} is {state}"
            address = ((node.get("Spec") or {}).get("Labels") or {}).get(LABEL_ENGINE)
            if not address:
                return None, (
                    f"the manager's engine has no stats of other nodes' containers, and node {hostname} "
                    f"has no {LABEL_ENGINE} label naming its own engine"
                )
            if address in down:
                return None, down[address]
            try:
                api = self._engine_api(address)
            except Exception as exc:  # noqa: BLE001 — that node's engine is unreachable
                down[address] = f"its engine at {address} did not answer: {str(exc)[:200]}"
                return None, down[address]
        import docker.errors

        try:
            stats = api.stats(cid, stream=False, one_shot=True)
        except docker.errors.NotFound:
            return None, "its container went while it was read (a replica being replaced)"
        except Exception as exc:  # noqa: BLE001 — its engine went
            if address is not None:
                self._engine_clients.pop(address, None)
                down[address] = f"its engine at {address} did not answer: {str(exc)[:200]}"
                return None, down[address]
            return None, f"the manager's engine did not answer: {str(exc)[:200]}"
        return stats, ""

    def _engine_api(self, address: str) -> Any:
        """The low-level API of a node's engine (one client per address, made on first use)."""
        with self._lock:
            client = self._engine_clients.get(address)
        if client is None:
            client = self._engines(address)
            with self._lock:
                self._engine_clients[address] = client
        return client.api

    # -- logs: the engine's service logs into the provider's log store ---------------------
    def _follow_logs(self, record: FunctionRecord, instance: str, service: str, since: float | None) -> None:
        """Copy `service`'s logs (every task's, wherever it runs: Swarm streams them from the
        workers to the manager) into the function's log, once per service."""
        with self._lock:
            if service in self._following or self._closed.is_set():
                return
            self._following.add(service)
        threading.Thread(
            target=self._copy_logs,
            args=(record.namespace, record.name, instance, service, since),
            name=f"logs-{service}",
            daemon=True,
        ).start()

    def _copy_logs(self, namespace: str, name: str, instance: str, service: str, since: float | None) -> None:
        partial = b""
        try:
            kwargs: dict[str, Any] = {"follow": True, "stdout": True, "stderr": True}
            if since is not None:
                kwargs["since"] = int(since)
            for chunk in self.api.service_logs(service, **kwargs):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for line in lines:
                    self.logs.append(namespace, name, instance, line.decode("utf-8", "replace"))
            if partial:
                self.logs.append(namespace, name, instance, partial.decode("utf-8", "replace"))
        except Exception as exc:  # noqa: BLE001 — a removed service or a lost engine ends the stream
            log.debug("%s: log stream ended: %s", service, exc)
        finally:
            with self._lock:
                self._following.discard(service)

    def close(self) -> None:
        """Stop supervising; the services keep running (Swarm runs them without this provider,
        and a restarted provider adopts them by their labels)."""
        self._closed.set()
        if self.schedulers is not None:
            self.schedulers.close()
        with self._lock:
            self._changed.notify_all()
        self._supervisor.join(5)

    # -- Swarm objects -------------------------------------------------------------------
    def _services(self, namespace: str | None = None, name: str | None = None) -> list[dict]:
        labels = [f"{LABEL_OWNER}={self.stack}"]
        if namespace is not None:
            labels.append(f"{LABEL_NAMESPACE}={namespace}")
        if name is not None:
            labels.append(f"{LABEL_FUNCTION}={name}")
        return self.api.services(filters={"label": labels})

    def _remove_service(self, service_id: str) -> None:
        import docker.errors

        try:
            self.api.remove_service(service_id)
        except docker.errors.NotFound:
            pass

    def _secret(self, namespace: str, name: str) -> Any:
        """A Swarm secret holding the provider's secret `name` (by content: a changed value is a
        new Swarm secret, and so a new spec digest and a rolling update)."""
        data = self.secrets.path(namespace, name).read_bytes()
        return self._swarm_secret(f"faas-gpu-{namespace}-{name}", data, f"{SECRETS_PATH}/{name}")

    def _token_secret(self, record: FunctionRecord, token: str) -> Any:
        """The function's own token as a Swarm secret, a file in its tasks (never their env: a
        function may show its environment to anyone, as `printenv` does)."""
        filename = f"{containers.TOKEN_DIR}/{containers.TOKEN_NAME}"
        return self._swarm_secret(f"faas-gpu-token-{record.namespace}-{record.name}", token.encode(), filename)

    def _swarm_secret(self, prefix: str, data: bytes, filename: str) -> Any:
        from docker.types import SecretReference

        sname = f"{prefix[:51]}-{hashlib.sha256(data).hexdigest()[:12]}"  # Swarm's 64 characters, the digest kept
        sid = self._secret_ids.get(sname)
        if sid is None:
            found = self.api.secrets(filters={"name": sname})
            found = [s for s in found if s["Spec"]["Name"] == sname]
            sid = (
                found[0]["ID"] if found else self.api.create_secret(sname, data, labels={LABEL_OWNER: self.stack})["ID"]
            )
            self._secret_ids[sname] = sid
        return SecretReference(sid, sname, filename=filename, uid="0", gid="0", mode=0o444)

    def _instance_specs(self, fn: _Function) -> list[tuple[str, dict[str, str]]]:
        if fn.plan is not None:
            return [(inst.id, dict(inst.env)) for inst in fn.plan]
        return [(f"r{i}", {}) for i in range(max(fn.record.replicas, 0))]

    def _spec_digest(self, record: FunctionRecord, inst_env: dict[str, str]) -> str:
        secrets = {}
        for s in record.deployment.secrets or ():
            try:
                secrets[s] = hashlib.sha256(self.secrets.path(record.namespace, s).read_bytes()).hexdigest()
            except OSError:
                secrets[s] = None
        return _digest(record.deployment.to_json(), inst_env, self.gpu_env, secrets)

    def _plan(self, record: FunctionRecord) -> containers.ContainerPlan:
        """The shared container spec (containers.py: labels, env, token, limits), with every
        scheduler the directory knows in the replicas' scheduler URL."""
        gpu_env = dict(self.gpu_env)
        url = contract_env.SCHEDULER_URL.name
        if gpu_env.get(url) and self.schedulers is not None:
            gpu_env[url] = merge_schedulers(gpu_env[url], self.schedulers.urls())
        token = None
        if gpu_env and self.credentials is not None:
            token = self.credentials.token(record.namespace, record.name)
        return containers.plan_container(
            record,
            image_id=record.deployment.image,  # the registry's tag: the manager's engine may not hold it
            owner=self.stack,
            stop_timeout_s=check_record(record, self.secrets),
            gpu_env=gpu_env,
            token=token,
        )

    def _create(self, record: FunctionRecord, instance: str, inst_env: dict[str, str], digest: str, port: int) -> None:
        from docker.types import (
            ContainerSpec,
            EndpointSpec,
            Healthcheck,
            Placement,
            Resources,
            RestartPolicy,
            ServiceMode,
            TaskTemplate,
        )

        plan = self._plan(record)
        name = _service_name(record, instance, digest)
        spec = containers.replica_container(
            plan,
            replica_id=name,
            port=port,
            upstream_port=port + 1,
            digest=digest,
            instance=InstanceSpec(instance, inst_env) if inst_env else None,
            bind_address="0.0.0.0",  # the gateway reaches replicas at their node's address
        )
        service_labels = {**spec.labels, LABEL_INSTANCE: instance}
        container = ContainerSpec(
            spec.image,
            env=spec.env,
            labels=spec.labels,
            secrets=[self._secret(record.namespace, s) for s in plan.secrets]
            + ([self._token_secret(record, plan.token)] if plan.token else []),
            read_only=spec.read_only_rootfs,
            hostname=f"{record.name}-{instance}"[:63],
            # the watchdog drains its in-flight calls on SIGTERM for up to write_timeout
            stop_grace_period=int(spec.stop_timeout_s * 1e9),
            healthcheck=Healthcheck(interval=int(HEALTH_INTERVAL_S * 1e9)),  # the image's test, checked often
        )
        template = TaskTemplate(
            container,
            resources=Resources(**swarm_resources(record)),
            restart_policy=RestartPolicy(condition="any", delay=int(1e9), max_attempts=0),
            placement=Placement(constraints=list(record.deployment.constraints or [])),
            networks=[self.network or "host"],
        )
        self.api.create_service(
            template,
            name=name,
            labels=service_labels,
            mode=ServiceMode("replicated", replicas=1),
            endpoint_spec=EndpointSpec(mode="dnsrr"),
        )
        self._follow_logs(record, instance, name, since=None)

    # -- the supervisor ------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._closed.is_set():
            try:
                self._tick()
            except Exception:  # the supervisor must outlive any one bad call to the engine
                log.exception("swarm supervisor tick failed")
            with self._lock:
                self._changed.wait(self.every_s)

    def _tick(self) -> None:
        services = self._services()
        nodes = {n["ID"]: n for n in self.api.nodes()}
        tasks: dict[str, list[dict]] = {}
        for t in self.api.tasks():  # Swarm filters tasks by their own labels, not their service's
            tasks.setdefault(t["ServiceID"], []).append(t)
        used = {int(s["Spec"]["Labels"].get(LABEL_PORT, 0)) for s in services}
        by_fn: dict[tuple[str, str], list[dict]] = {}
        for s in services:
            lab = s["Spec"]["Labels"]
            by_fn.setdefault((lab.get(LABEL_NAMESPACE, ""), lab.get(LABEL_FUNCTION, "")), []).append(s)
        with self._lock:
            fns = dict(self._fns)
        for key, svcs in by_fn.items():
            if key not in fns:  # left over from a removed function (or from before a restart: adopted at apply)
                if not self._adoptable(key):
                    for s in svcs:
                        self._remove_service(s["ID"])
        for key, fn in fns.items():
            try:
                self._reconcile(fn, by_fn.get(key, []), tasks, nodes, used)
            except Exception as exc:  # noqa: BLE001 — this function's own trouble, shown by describe
                log.warning("%s.%s: %s", key[1], key[0], exc)
                with self._lock:
                    fn.problem = {"state": "error", "message": str(exc)[:500]}
                    self._changed.notify_all()

    def _adoptable(self, key: tuple[str, str]) -> bool:
        """Services of a function this provider has no record of are removed, unless it just
        started and has not restored its records yet (a restart keeps the running replicas)."""
        return time.monotonic() - self._started_at < ADOPT_GRACE_S

    def _reconcile(
        self, fn: _Function, svcs: list[dict], tasks: dict[str, list[dict]], nodes: dict[str, dict], used: set[int]
    ) -> None:
        record = fn.record
        want = {inst: (env, self._spec_digest(record, env)) for inst, env in self._instance_specs(fn)}
        have: dict[str, list[dict]] = {}
        for s in svcs:
            have.setdefault(s["Spec"]["Labels"].get(LABEL_INSTANCE, ""), []).append(s)
        ready: dict[str, str] = {}
        problem: dict[str, str] | None = None
        stale: list[tuple[str, dict]] = []
        for inst, ss in have.items():
            for s in ss:  # adopted after a restart, or a stream that ended: new lines from now on
                if s["Spec"]["Name"] not in self._following and inst in want:
                    self._follow_logs(record, inst, s["Spec"]["Name"], since=time.time())
            if inst not in want:
                for s in ss:
                    self._remove_service(s["ID"])
                continue
            current = [s for s in ss if s["Spec"]["Labels"].get(LABEL_DIGEST) == want[inst][1]]
            old = [s for s in ss if s not in current]
            for s in current + old:
                url, trouble = self._task_state(s, tasks.get(s["ID"], []), nodes)
                if url is not None and inst not in ready:
                    answer = True if url in fn.ready.values() else probe(url)
                    if answer:
                        ready[inst] = url
                    elif s in current and getattr(answer, "failed", None):  # its handler cannot load
                        trouble = {"state": "StartFailed", "message": f"replica not ready: {answer.failed}"}
                if trouble is not None and s in current:
                    problem = trouble
            if current and old and inst in ready and ready[inst] in self._urls(current, tasks, nodes):
                for s in old:  # the replacement serves: the old instance goes
                    self._remove_service(s["ID"])
            elif not current:
                stale.append((inst, old[0]))
        # a rolling update: one stale instance is replaced at a time, while the others serve
        updating = any(
            any(s["Spec"]["Labels"].get(LABEL_DIGEST) == want[i][1] for s in have.get(i, []))
            and len(have.get(i, [])) > 1
            for i in want
        )
        if stale and not updating:
            inst, _ = stale[0]
            self._create(record, inst, want[inst][0], want[inst][1], self._port(used))
        for inst, (env, digest) in want.items():
            if inst not in have:
                self._create(record, inst, env, digest, self._port(used))
        rolling = [i for i in want if any(s["Spec"]["Labels"].get(LABEL_DIGEST) != want[i][1] for s in have.get(i, []))]
        with self._lock:
            fn.ready = ready
            fn.problem = None if ready else problem
            fn.rollout = _rollout(record.name, len(want), len(rolling), len(ready), problem) if rolling else None
            self._changed.notify_all()

    def rollout(self, namespace: str, name: str) -> dict[str, Any] | None:
        fn = self._fns.get((namespace, name))
        return fn.rollout if fn is not None else None

    def _urls(self, svcs: list[dict], tasks: dict[str, list[dict]], nodes: dict[str, dict]) -> set[str]:
        return {u for s in svcs if (u := self._task_state(s, tasks.get(s["ID"], []), nodes)[0])}

    def _task_state(self, svc: dict, tasks: list[dict], nodes: dict[str, dict]) -> tuple[str | None, dict | None]:
        """(URL of the service's running task on a ready node, or None; the service's problem,
        or None): rejected or failing tasks with none running."""
        port = svc["Spec"]["Labels"].get(LABEL_PORT)
        running = None
        for t in tasks:
            node = nodes.get(t.get("NodeID", ""))
            if (
                t["Status"]["State"] == "running"
                and t["DesiredState"] == "running"
                and node is not None
                and node["Status"]["State"] == "ready"
            ):
                addr = self._task_address(t, node)
                if addr:
                    running = f"http://{addr}:{port}"
        if running is not None:
            return running, None
        failed = sorted(
            (t for t in tasks if t["Status"]["State"] in FAILED_STATES), key=lambda t: t["Status"]["Timestamp"]
        )
        if not failed:
            pending = [t for t in tasks if t["Status"]["State"] == "pending" and t["Status"].get("Err")]
            if pending:  # e.g. "no suitable node (scheduling constraints not satisfied on 3 nodes)"
                return None, {"state": "unschedulable", "message": pending[-1]["Status"]["Err"]}
            return None, None
        last = failed[-1]["Status"]
        message = last.get("Err") or last.get("Message") or last["State"]
        if last["State"] == "rejected":
            return None, {"state": "rejected", "message": message}
        if len(failed) >= CRASH_LOOP_FAILURES:
            return None, {"state": "crash-loop", "message": message}
        return None, None

    def _task_address(self, task: dict, node: dict) -> str | None:
        """Where a running task is reached: its node's address on the host network, or its own
        address on the overlay (NetworksAttachments, "10.0.1.7/24")."""
        if self.network is None:
            return node_address(node)
        for att in task.get("NetworksAttachments") or ():
            if (att.get("Network") or {}).get("Spec", {}).get("Name") == self.network and att.get("Addresses"):
                return att["Addresses"][0].split("/", 1)[0]
        return None

    def _port(self, used: set[int]) -> int:
        for _ in range(10000):
            port = random.randrange(PORT_RANGE[0], PORT_RANGE[1], 2)
            if port not in used:
                used.add(port)
                return port
        raise LaunchError("no free port left in the swarm runtime's range")
