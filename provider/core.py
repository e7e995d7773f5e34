"""The provider's verbs (deploy, update, delete, scale, status) over the store and a runtime.

HTTP lives in `system.py` (its verbs in `handlers/`) and `gateway.py`; this module only knows the domain.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from faas_gpu import __version__
from faas_gpu.async_queue import AsyncQueue
from faas_gpu.datastore import Datastore
from faas_gpu.fn_credentials import FunctionCredentials

from .activity import Activity
from .auth import Credentials
from .config import ProviderConfig
from .inflight import max_inflight_of
from .invoke import Invoker
from .logs import LogStore
from .runtime import LaunchError, Runtime
from .scaling import ScalingRouter
from .scaling.replicas import alert_replicas
from .store import FunctionStore, SecretStore
from .types import FunctionDeployment, FunctionRecord, ValidationError, validate_name
from .validation import clamp_replicas, gateway_scale_bounds, scale_factor

log = logging.getLogger(__name__)

ORCHESTRATION = {"local": "local-process", "docker": "docker", "swarm": "swarm"}
"""ProviderInfo's `orchestration` by runtime: what runs the replicas, as each OpenFaaS provider names
its own (faasd `containerd`, faas-netes `kubernetes`, faas-swarm `swarm`)."""


class NotFoundError(LookupError):
    pass


@dataclass
class Provider:
    config: ProviderConfig
    credentials: Credentials
    datastore: Datastore
    store: FunctionStore
    secrets: SecretStore
    logs: LogStore
    runtime: Runtime
    invoker: Invoker
    queue: AsyncQueue
    autoscaler: ScalingRouter | None = None
    fn_credentials: FunctionCredentials | None = None
    """Each function's own GPU-path token (with a scheduler): issued at deploy, revoked on remove."""
    activity: Activity = field(default_factory=Activity)
    """What the gateway saw of each function lately (rate, SLO tally), for the status page."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    # -- namespaces ----------------------------------------------------------------------
    def namespace(self, value: str | None) -> str:
        ns = value or self.config.namespaces[0]
        if ns not in self.config.namespaces:
            raise ValidationError(
                f"namespace: {ns!r} is not a valid namespace (allowed: {', '.join(self.config.namespaces)})"
            )
        return ns

    # -- functions -----------------------------------------------------------------------
    def deploy(self, body: object, namespace_query: str | None, *, update: bool) -> FunctionRecord:
        dep = FunctionDeployment.from_json(body)
        try:
            max_inflight_of(dep.envVars)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        ns = self.namespace(dep.namespace or namespace_query)
        dep.namespace = ns
        lo, _hi = dep.scale_bounds()
        with self._lock:
            existing = self.store.get(ns, dep.service)
            if update and existing is None:
                raise NotFoundError(f"function {dep.service}.{ns} not found")
            if existing is not None:
                previous = self._previous(existing, dep)
                record = FunctionRecord(dep, ns, max(existing.replicas, lo), existing.created_at, previous)
            else:
                record = FunctionRecord(dep, ns, lo)
            try:
                self.runtime.check(record)
            except LaunchError as exc:
                raise ValidationError(str(exc)) from None
            if self.autoscaler is not None:
                self.autoscaler.validate(record)
            self.store.put(record)
            if self.fn_credentials is not None:
                self.fn_credentials.issue(ns, dep.service)
        if self.autoscaler is not None:
            self.autoscaler.prepare(record)
        self.runtime.apply(record)
        return self.store.get(ns, dep.service) or record

    def _previous(self, existing: FunctionRecord, new: FunctionDeployment) -> FunctionDeployment | None:
        """The version `faas-gpu rollback` returns to once `new` replaces `existing`: the version
        before it, skipping one that never served (a broken deploy over a good one, then another:
        the good one stays the one to return to). None when that would be `new` itself."""
        if existing.deployment.to_json() == new.to_json():
            return existing.previous
        served = self.runtime.version_served(existing.namespace, existing.name)
        previous = existing.deployment if served else existing.previous
        if previous is not None and previous.to_json() == new.to_json():
            return None
        return previous

    def delete(self, body: object, namespace_query: str | None) -> None:
        if not isinstance(body, dict):
            raise ValidationError("body: must be a DeleteFunctionRequest JSON object")
        raw = body.get("functionName")
        if not isinstance(raw, str) or not raw:
            raise ValidationError("functionName: is required")
        ns, name = self._name_and_ns(raw, body.get("namespace") or namespace_query)
        with self._lock:
            if not self.store.delete(ns, name):
                raise NotFoundError(f"function {name}.{ns} not found")
        self.invoker.forget((ns, name))
        self.activity.forget((ns, name))
        if self.autoscaler is not None:
            self.autoscaler.forget((ns, name))
        self.runtime.remove(ns, name)
        if self.fn_credentials is not None:  # after its replicas stopped: none restarts with it
            self.fn_credentials.revoke(ns, name)

    def scale(
        self, path_name: str, body: object, namespace_query: str | None, *, gateway: bool = False
    ) -> tuple[FunctionRecord, str | None]:
        """Scale within com.openfaas.scale.min/max; the message says so when the request was clamped.

        The provider API refuses 0 as faas-netes CE does; the gateway routes (`gateway`) clamp as
        the CE gateway does (gateway/scaling/ranges.go): 0 becomes the minimum, and with no
        `com.openfaas.scale.max` the maximum is CE's 5 (`validation.gateway_scale_bounds`)."""
        if not isinstance(body, dict):
            raise ValidationError("body: must be a ScaleServiceRequest JSON object")
        replicas = body.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ValidationError("replicas: must be a non-negative integer")
        if replicas == 0 and not gateway:
            raise ValidationError("replicas: cannot be set to 0 in OpenFaaS CE")
        service = body.get("serviceName") or path_name
        if not isinstance(service, str):
            raise ValidationError("serviceName: must be a string")
        ns, name = self._name_and_ns(service, body.get("namespace") or namespace_query)
        with self._lock:
            record = self.store.get(ns, name)
            if record is None:
                raise NotFoundError(f"function {name}.{ns} not found")
            labels = record.deployment.labels
            bounds = gateway_scale_bounds(labels) if gateway else record.deployment.scale_bounds()
            record.replicas, clamped = clamp_replicas(replicas, bounds)
            self.store.put(record)
        return self._apply_replicas(record), clamped

    def scale_by_alert(self, function_name: str, status: str) -> None:
        """One alert of AlertManager's webhook (`POST /system/alert`), as the CE gateway's
        alert handler applies it: "firing" adds ceil(max/100*factor) replicas, anything else goes
        back to the minimum. Like CE, a function it cannot look up (unknown, bad name, a scale
        factor of 0) is skipped, not an error: AlertManager would only retry it. A function a
        faas-gpu policy scales is left to that policy."""
        raw, _, suffix = function_name.rpartition(".")  # CE's GetNamespace: the last dot
        name, ns = (raw, suffix) if raw else (function_name, None)
        try:
            key = (self.namespace(ns), validate_name(name))
        except ValidationError:
            log.info("alert for %r: not a function name; skipped", function_name[:80])
            return
        with self._lock:
            record = self.store.get(*key)
            if record is None:
                log.info("alert for %s.%s: no such function; skipped", key[1], key[0])
                return
            if self.autoscaler is not None and self.autoscaler.manages(key):
                log.info("alert for %s.%s: its faas-gpu scaling policy scales it; skipped", key[1], key[0])
                return
            labels = record.deployment.labels
            factor = scale_factor(labels)
            if factor == 0:
                return
            lo, hi = gateway_scale_bounds(labels)
            new = alert_replicas(status, record.replicas, lo, hi, factor)
            log.info("[Scale] function=%s.%s %d => %d (alert %s)", key[1], key[0], record.replicas, new, status)
            if new == record.replicas:
                return
            record.replicas = new
            self.store.put(record)
        self._apply_replicas(record)

    def _apply_replicas(self, record: FunctionRecord) -> FunctionRecord:
        """A stored replica count applied: through the function's policy, else by the runtime."""
        if self.autoscaler is not None and self.autoscaler.scale_to(record.key, record.replicas):
            return self.store.get(*record.key) or record  # the function's policy applied (and stored) it
        self.runtime.apply(record)
        return record

    def scale_from_zero(self, key: tuple[str, str]) -> None:
        if self.autoscaler is not None and self.autoscaler.scale_from_zero(key):
            return
        with self._lock:
            record = self.store.get(*key)
            if record is None or record.replicas > 0:
                return
            record.replicas = max(1, record.deployment.scale_bounds()[0])
            self.store.put(record)
        self.runtime.apply(record)

    def _name_and_ns(self, raw: str, ns: object) -> tuple[str, str]:
        if ns is not None and not isinstance(ns, str):
            raise ValidationError("namespace: must be a string")
        name, suffix_ns = raw.split(".", 1) if "." in raw else (raw, None)
        return self.namespace(suffix_ns or ns), name

    def get(self, raw_name: str, namespace_query: str | None) -> FunctionRecord:
        ns, name = self._name_and_ns(raw_name, namespace_query)
        record = self.store.get(ns, name)
        if record is None:
            why = self.store.quarantine_reason(ns, name)
            if why is not None:  # for the operator (/system/* wants the admin's credentials)
                raise NotFoundError(
                    f"function {name}.{ns} not found: its stored record is quarantined, never started, because "
                    f"{why}; deploy it again to replace it, or remove it (README: 'Quarantined records')"
                )
            raise NotFoundError(f"function {name}.{ns} not found")
        return record

    def status(self, record: FunctionRecord, usage: bool = False, *, detail: bool = False) -> dict:
        """OpenFaaS's FunctionStatus, plus faas-gpu's own fields (faas-cli ignores fields it does
        not know): `faasGpuStatus` ({state, message}) while the function cannot serve for a
        reason of its own, `faasGpuRollout` while a new version is on its way in (or stalled), and
        with `detail` (one function's status) `faasGpuPrevious`, the deployment `faas-gpu rollback`
        deploys again (through any gateway: it is a plain PUT /system/functions)."""
        key = record.key
        out = record.status(
            available=len(self.runtime.endpoints(*key)),
            invocations=self.invoker.counts.get(key, 0),
            usage=self.runtime.usage(*key) if usage else None,
        )
        problem = self.runtime.problem(*key)
        if problem is not None:
            out["faasGpuStatus"] = problem
        rollout = self.runtime.rollout(*key)
        if rollout is not None:
            out["faasGpuRollout"] = rollout
        if detail and record.previous is not None:
            out["faasGpuPrevious"] = record.previous.to_json()
        return out

    def instances(self, record: FunctionRecord) -> dict:
        """The autoscaler's view of a managed function, or the plain replicas of another."""
        described = self.autoscaler.describe(record.key) if self.autoscaler is not None else None
        ready = dict(self.runtime.ready_instances(*record.key))
        if described is None:
            ids = self.runtime.instances(*record.key)
            return {
                "name": record.name,
                "namespace": record.namespace,
                "managed": False,
                "instances": [{"id": i} for i in ids],
            }
        for inst in described["instances"]:
            inst["ready"] = inst["id"] in ready
        return {"managed": True, **described}

    def restore(self) -> int:
        """Start what the datastore says should run (after a provider restart)."""
        started = 0
        for record in self.store.list():
            try:
                if self.autoscaler is not None:
                    try:
                        self.autoscaler.prepare(record)
                    except ValidationError as exc:
                        log.error("%s.%s runs without its autoscaler: %s", record.name, record.namespace, exc)
                if self.fn_credentials is not None:  # a new datastore learns the tokens again
                    self.fn_credentials.issue(record.namespace, record.name)
                self.runtime.apply(record)
                started += 1
            except LaunchError as exc:
                log.error("cannot restore %s.%s: %s", record.name, record.namespace, exc)
        return started

    def info(self) -> dict:
        """faas-provider's ProviderInfo, and (ours) whether functions are isolated from the stack
        and each other (`faasGpuIsolation`; the local runtime's sandbox, `runtime.isolation`)."""
        runtime = self.config.runtime or "local"
        orchestration = ORCHESTRATION.get(runtime, runtime)
        info = {"provider": "faas-gpu", "orchestration": orchestration, "version": _version_info()}
        isolation = self.runtime.isolation() if self.runtime is not None else None
        if isolation is not None:
            info["faasGpuIsolation"] = isolation.describe()
        return info

    def gateway_version(self) -> dict:
        """The gateway's own VersionInfo for the gateway's /system/info (CE builds it from the
        gateway's version, not the provider's); one program here, so the same release and sha."""
        return _version_info()

    def close(self) -> None:
        if self.autoscaler is not None:
            self.autoscaler.close()
        self.runtime.close()
        self.queue.close()
        self.datastore.close()


def _version_info() -> dict:
    """faas-provider's VersionInfo; `commit_message` is `omitempty` in Go, so it is left out."""
    return {"sha": _git_sha(), "release": __version__}


def _git_sha() -> str:
    from faas_gpu.paths import REPO_ROOT

    head = REPO_ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (REPO_ROOT / ".git" / ref[5:]).read_text().strip()
        return ref
    except OSError:
        return "unknown"
