"""The seam between the provider and whatever runs replicas (processes now, Docker later)."""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from faas_gpu.contract import readiness

from ..types import FunctionRecord


@dataclass(frozen=True)
class Readiness:
    """One answer of a replica's `/_/ready` (`faas_gpu.contract.readiness`): ready, not yet
    (`failed` None), or never: its function's own check said why it cannot serve."""

    ready: bool
    failed: str | None = None

    def __bool__(self) -> bool:
        return self.ready


NOT_YET = Readiness(False)


def probe_readiness(host: str, port: int, timeout_s: float = 0.5) -> Readiness:
    """A replica's watchdog's `/_/ready`: the readiness every runtime probes, whatever runs it."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", readiness.PATH)
        resp = conn.getresponse()
        if resp.status == readiness.READY:
            return Readiness(True)
        if resp.status == readiness.FAILED:
            return Readiness(False, readiness.failure_reason(resp.read(4 * readiness.REASON_LIMIT)))
        return NOT_YET
    except (OSError, http.client.HTTPException):
        return NOT_YET
    finally:
        conn.close()


def watchdog_ready(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether a replica's watchdog answers `/_/ready` with 200 (it does once its function serves)."""
    return probe_readiness(host, port, timeout_s).ready


class LaunchError(Exception):
    """A deployment that cannot run (unknown image, nothing runnable): the deploy gets 400."""


@dataclass(frozen=True)
class InstanceSpec:
    """One instance of a function that a scaling policy sized on its own (INFless's non-uniform
    instances, HarmonyBatch's pools): a stable id, and the env that gives it its batch size,
    threads and share. It crosses the seam (`Runtime.set_plan`), so it lives beside it."""

    id: str
    env: dict[str, str] = field(default_factory=dict)

    def digest(self, spec_digest: str) -> str:
        return hashlib.sha256(json.dumps([spec_digest, self.env], sort_keys=True).encode()).hexdigest()[:16]


class Runtime(ABC):
    @abstractmethod
    def check(self, record: FunctionRecord) -> None:
        """Raise LaunchError when the record could never start."""

    @abstractmethod
    def apply(self, record: FunctionRecord) -> None:
        """Make the running replicas match the record (count and spec)."""

    @abstractmethod
    def remove(self, namespace: str, name: str) -> None: ...

    @abstractmethod
    def endpoints(self, namespace: str, name: str) -> list[str]:
        """Base URLs of the ready replicas."""

    @abstractmethod
    def instances(self, namespace: str, name: str) -> list[str]: ...

    @abstractmethod
    def wait_ready(self, namespace: str, name: str, timeout_s: float) -> bool: ...

    def usage(self, namespace: str, name: str) -> dict | None:
        return None

    def isolation(self) -> Any:
        """How replicas are kept apart from the stack and each other, where the runtime does it
        itself (the local runtime's `isolation.Isolation`); None where an engine does (containers)."""
        return None

    def problem(self, namespace: str, name: str) -> dict[str, str] | None:
        """Why the function cannot serve, when the reason is its own ({"state", "message"}):
        requests answer 503 with the message at once and describe shows it."""
        return None

    def rollout(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A new version on its way in while the previous one serves ({"state": "Progressing" or
        "Stalled", "message", ...}, faas-gpu's `faasGpuRollout`); None once settled."""
        return None

    def version_served(self, namespace: str, name: str) -> bool:
        """Whether the version last applied has served (a replica of it was ready): a version that
        never did is not the one `faas-gpu rollback` goes back to. True where a runtime cannot tell."""
        return True

    def ready_instances(self, namespace: str, name: str) -> list[tuple[str, str]]:
        """(instance id, base URL) of the ready replicas, for a dispatcher that weighs instances."""
        return [(url, url) for url in self.endpoints(namespace, name)]

    def set_plan(self, namespace: str, name: str, plan: list[InstanceSpec] | None) -> None:
        """Run exactly these instances (per-instance settings), or back to identical replicas
        (None: what a runtime without per-instance plans always runs)."""
        if plan is None:
            return
        raise NotImplementedError(f"{type(self).__name__} cannot run per-instance plans")

    @abstractmethod
    def close(self) -> None: ...


class WatchedRuntime(Runtime):
    """A runtime that keeps each function's state (`_fns`, each with a `problem`) under `_lock`
    and notifies `_changed` whenever replicas come, go or fail: waiting for a ready replica and
    saying why a function cannot serve are then the same whatever runs the replicas (processes,
    containers, Swarm services)."""

    _lock: threading.RLock
    _changed: threading.Condition
    _fns: dict[tuple[str, str], Any]

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
