"""A function replica as a container: the pure spec (image, labels, env, mounts, limits, port).

No engine call here: the Docker runtime (and the Swarm runtime, for its services' task template)
turn a `ContainerSpec` into API calls, and the tests read it without an engine.

What a replica gets, and why:
- OpenFaaS's labels as the real providers set them: `com.openfaas.function` and `function=true`
  (faas-swarm), `faas_function` (faas-netes' pod label), the function's own labels, and each
  annotation as `com.openfaas.annotations.<key>` (faasd's `buildLabels`; a label that clashes
  with an annotation's is refused, as faasd refuses it). Ours (`com.faas-gpu.*`) let a provider
  find its containers again (after a crash) and tell replicas of one spec from another's.
- Env: the function's envVars, `envProcess` as `fprocess` (else the image's own ENV decides), the
  watchdog's `port` — containers run on the host network, so every replica listens on a port of
  its own, and its http-mode upstream too (`upstream_url`); `metrics_port=0`, since of-watchdog's
  fixed 8081 would clash on a shared network — plus the GPU client's settings (from annotations),
  how it reaches the scheduler and where its function's own scoped token is
  (`FAAS_GPU_TOKEN_FILE`), and an INFless instance's own env on top. Nothing of the provider's own
  environment or credentials: no state folder, no cluster token, no datastore address.
- Secrets: one read-only bind mount of a folder holding only this function's secrets, at
  `/var/openfaas/secrets` (OpenFaaS's path; the certifier `cat`s it). The function's token is a
  file too, in a folder of its own mounted read-only at `/var/openfaas/faas-gpu` (never an
  environment variable: a function that shows its environment, as `printenv` does to anyone,
  would show it).
- `limits`/`requests` in OpenFaaS's (Kubernetes') quantities: memory as the container's memory
  limit (no swap beyond it, so over the limit is an OOM kill), `requests.memory` as its
  reservation, `limits.cpu` as nano-CPUs, `requests.cpu` as CPU shares.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from decimal import Decimal

from faas_gpu.contract import env as contract_env
from faas_gpu.contract import labels as runtime_labels
from faas_gpu.contract import replica as where

from ..types import FunctionRecord
from ..validation import ValidationError, parse_quantity
from .base import InstanceSpec, LaunchError
from .launch import gpu_settings

SECRETS_PATH = where.SECRETS_PATH
TOKEN_DIR = where.FAAS_GPU_DIR
TOKEN_NAME = "token"
ANNOTATION_LABEL_PREFIX = "com.openfaas.annotations."
LABEL_FUNCTION = "com.openfaas.function"
LABEL_FAAS_FUNCTION = "faas_function"
LABEL_NAMESPACE = "com.openfaas.namespace"
# ours: which provider runs the container, which replica and spec it is (faas_gpu.contract.labels)
LABEL_OWNER = runtime_labels.OWNER
LABEL_REPLICA = runtime_labels.REPLICA
LABEL_DIGEST = runtime_labels.DIGEST
LABEL_SLOT = runtime_labels.SLOT
LABEL_PORT = runtime_labels.PORT

MIN_MEMORY_BYTES = 6 * 1024 * 1024
"""Docker's smallest memory limit (the engine refuses less): a smaller `limits.memory` (the
certifier deploys "5Mi") is raised to it rather than failing every start."""
NANO = 10**9


@dataclass(frozen=True)
class Resources:
    mem_limit: int | None = None
    mem_reservation: int | None = None
    nano_cpus: int | None = None
    cpu_shares: int | None = None


@dataclass(frozen=True)
class ContainerPlan:
    """What every replica of one function shares (the runtime's `spec`: `digest` tells a
    replica of this spec from an older one, for the rolling update)."""

    image: str
    env: dict[str, str]
    labels: dict[str, str]
    resources: Resources
    secrets: tuple[str, ...]
    read_only_rootfs: bool
    stop_timeout_s: float
    digest: str
    token: str | None = field(default=None, repr=False)
    """The function's own token, for the file each replica finds at `TOKEN_DIR`/token."""


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerSpec:
    """One replica's container: what `docker run --network host` gets."""

    name: str
    image: str
    env: dict[str, str]
    labels: dict[str, str]
    port: int
    resources: Resources = field(default_factory=Resources)
    mounts: tuple[Mount, ...] = ()
    read_only_rootfs: bool = False
    stop_timeout_s: float = 35.0

    def create_kwargs(self) -> dict:
        """Keyword arguments of docker-py's `containers.create` (restart policy: none — the
        provider's supervisor restarts, with its back-off and crash-loop state)."""
        r = self.resources
        kwargs: dict = {
            "image": self.image,
            "name": self.name,
            "environment": dict(self.env),
            "labels": dict(self.labels),
            "network_mode": "host",
            "detach": True,
            "read_only": self.read_only_rootfs,
            "stop_signal": "SIGTERM",
            "volumes": {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in self.mounts},
        }
        if self.read_only_rootfs:  # the watchdog's lock file and Python's temp files
            kwargs["tmpfs"] = {"/tmp": "rw,exec,mode=1777"}
        if r.mem_limit is not None:
            kwargs["mem_limit"] = r.mem_limit
            kwargs["memswap_limit"] = r.mem_limit  # no swap beyond the limit: over it is an OOM kill
        if r.mem_reservation is not None:
            kwargs["mem_reservation"] = r.mem_reservation
        if r.nano_cpus is not None:
            kwargs["nano_cpus"] = r.nano_cpus
        if r.cpu_shares is not None:
            kwargs["cpu_shares"] = r.cpu_shares
        return kwargs


def memory_bytes(where: str, raw: str) -> int:
    """An OpenFaaS memory quantity ("128Mi", "1G", "512000k") in bytes, at least Docker's minimum."""
    return max(MIN_MEMORY_BYTES, int(_quantity(where, raw)))


def cpus(where: str, raw: str) -> Decimal:
    """An OpenFaaS cpu quantity ("100m", "0.5", "2") in cores."""
    value = _quantity(where, raw)
    if value <= 0:
        raise LaunchError(f"{where}: must be more than 0 cores, got {raw!r}")
    return value


def _quantity(where: str, raw: str) -> Decimal:
    try:
        return parse_quantity(where, raw)
    except ValidationError as exc:
        raise LaunchError(str(exc)) from None


def resources(limits: dict[str, str] | None, requests: dict[str, str] | None) -> Resources:
    limits, requests = limits or {}, requests or {}
    mem_limit = memory_bytes("limits.memory", limits["memory"]) if limits.get("memory") else None
    mem_reservation = memory_bytes("requests.memory", requests["memory"]) if requests.get("memory") else None
    if mem_limit is not None and mem_reservation is not None:
        mem_reservation = min(mem_reservation, mem_limit)  # the engine refuses a reservation above the limit
    nano_cpus = int(cpus("limits.cpu", limits["cpu"]) * NANO) if limits.get("cpu") else None
    cpu_shares = max(2, int(cpus("requests.cpu", requests["cpu"]) * 1024)) if requests.get("cpu") else None
    return Resources(mem_limit, mem_reservation, nano_cpus, cpu_shares)


def labels(record: FunctionRecord, owner: str) -> dict[str, str]:
    dep = record.deployment
    out = dict(dep.labels or {})
    for key, value in (dep.annotations or {}).items():
        label = ANNOTATION_LABEL_PREFIX + key
        if label in out:  # faasd: "Keys %s can not be used as a labels as is clashes with annotations"
            raise LaunchError(f"labels: {label!r} clashes with the label of annotation {key!r}")
        out[label] = value
    out.update(
        {
            LABEL_FUNCTION: record.name,
            LABEL_FAAS_FUNCTION: record.name,
            "function": "true",
            LABEL_NAMESPACE: record.namespace,
            LABEL_OWNER: owner,
        }
    )
    return out


def plan_container(
    record: FunctionRecord,
    *,
    image_id: str,
    owner: str,
    stop_timeout_s: float,
    gpu_env: dict[str, str] | None = None,
    token: str | None = None,
) -> ContainerPlan:
    """The spec all of `record`'s replicas share. `image_id`: the engine's id of the image the
    tag names now (a rebuilt image under the same tag is a new spec: replicas roll);
    `gpu_env`: how replicas reach the scheduler; `token`: the function's own scoped token."""
    dep = record.deployment
    env = {
        "PYTHONUNBUFFERED": "1",
        "metrics_port": "0",
        "healthcheck_interval": "100ms",
        contract_env.FUNCTION.name: record.name,
        contract_env.NAMESPACE.name: record.namespace,
        **(gpu_env or {}),
        **gpu_settings(dep.annotations or {}),
        **(dep.envVars or {}),
    }
    if gpu_env and token:
        env[contract_env.TOKEN_FILE.name] = f"{TOKEN_DIR}/{TOKEN_NAME}"
    else:
        token = None
    if dep.envProcess:
        env["fprocess"] = dep.envProcess
    identity = json.dumps([dep.to_json(), image_id], sort_keys=True).encode()
    return ContainerPlan(
        image=dep.image,
        env=env,
        labels=labels(record, owner),
        resources=resources(dep.limits, dep.requests),
        secrets=tuple(dep.secrets or ()),
        read_only_rootfs=bool(dep.readOnlyRootFilesystem),
        stop_timeout_s=stop_timeout_s,
        digest=hashlib.sha256(identity).hexdigest()[:16],
        token=token,
    )


def replica_container(
    plan: ContainerPlan,
    *,
    replica_id: str,
    port: int,
    upstream_port: int,
    digest: str | None = None,
    instance: InstanceSpec | None = None,
    secrets_source: str | None = None,
    token_source: str | None = None,
    bind_address: str = "127.0.0.1",
    extra_env: dict[str, str] | None = None,
) -> ContainerSpec:
    """One replica of `plan`: its ports (host network), its instance's env, its secrets folder
    (`secrets_source`, on the engine's host, mounted read-only at /var/openfaas/secrets) and the
    folder of its token file (`token_source`, mounted read-only at /var/openfaas/faas-gpu).
    `bind_address`: 127.0.0.1 where the provider is on the same host (Docker), 0.0.0.0 where the
    gateway reaches replicas on other hosts (Swarm)."""
    env = dict(plan.env)
    env.update(extra_env or {})
    if instance is not None:
        env.update(instance.env)
    env.update(
        port=str(port),
        bind_address=bind_address,
        HOSTNAME=replica_id,  # the template's context.hostname; a host-network container has the host's
    )
    env.setdefault("upstream_url", f"http://127.0.0.1:{upstream_port}")
    labels_ = {
        **plan.labels,
        LABEL_REPLICA: replica_id,
        LABEL_DIGEST: digest or plan.digest,
        LABEL_PORT: str(port),
    }
    if instance is not None:
        labels_[LABEL_SLOT] = instance.id
    mounts: tuple[Mount, ...] = ()
    if secrets_source is not None and plan.secrets:
        mounts += (Mount(secrets_source, SECRETS_PATH),)
    if token_source is not None and plan.token:
        mounts += (Mount(token_source, TOKEN_DIR),)
    return ContainerSpec(
        name=replica_id,
        image=plan.image,
        env=env,
        labels=labels_,
        port=port,
        resources=plan.resources,
        mounts=mounts,
        read_only_rootfs=plan.read_only_rootfs,
        stop_timeout_s=plan.stop_timeout_s,
    )
