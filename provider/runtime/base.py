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

from ..types import FunctionRecord


def watchdog_ready(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether a replica's watchdog answers `/_/ready` (it does once its function serves): the
    readiness every runtime probes, whatever runs the replica."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/_/ready")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


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
