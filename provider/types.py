"""faas-provider JSON types, validated: FunctionDeployment in, FunctionStatus out.

Field names are exactly those of faas-provider/types (function_deployment.go, function_status.go).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from faas_gpu.contract.annotations import CLASS as CLASS_ANNOTATION
from faas_gpu.contract.annotations import SLO_MS as SLO_ANNOTATION
from faas_gpu.contract.slo import RequestClass

from .validation import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    SCALE_MAX_LABEL,
    SCALE_MIN_LABEL,
    ValidationError,
    validate_deployment,
    validate_name,
)
from .validation import scale_bounds as _scale_bounds

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_MIN_REPLICAS",
    "SCALE_MAX_LABEL",
    "SCALE_MIN_LABEL",
    "FunctionDeployment",
    "FunctionRecord",
    "ValidationError",
    "validate_name",
]


def _str_map(body: dict, key: str) -> dict[str, str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValidationError(f"{key}: must be an object of string values")
    return dict(value)


def _str_list(body: dict, key: str) -> list[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(f"{key}: must be an array of strings")
    return list(value)


def split_namespace(name: str, namespace: str | None) -> tuple[str, str | None]:
    """`fn.ns` names carry their namespace (faas-cli and the gateway send them so)."""
    if "." in name:
        base, _, ns = name.partition(".")
        return base, ns
    return name, namespace


@dataclass
class FunctionDeployment:
    service: str
    image: str
    namespace: str | None = None
    envProcess: str | None = None  # noqa: N815 — OpenFaaS field name
    envVars: dict[str, str] | None = None  # noqa: N815
    constraints: list[str] | None = None
    secrets: list[str] | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    limits: dict[str, str] | None = None
    requests: dict[str, str] | None = None
    readOnlyRootFilesystem: bool | None = None  # noqa: N815

    @classmethod
    def from_json(cls, body: Any) -> FunctionDeployment:
        if not isinstance(body, dict):
            raise ValidationError("body: must be a FunctionDeployment JSON object")
        service = validate_name(body.get("service"))
        image = body.get("image")
        if not isinstance(image, str) or not image.strip():
            raise ValidationError("image: is required")
        namespace = body.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise ValidationError("namespace: must be a string")
        env_process = body.get("envProcess")
        if env_process is not None and not isinstance(env_process, str):
            raise ValidationError("envProcess: must be a string")
        ro = body.get("readOnlyRootFilesystem")
        if ro is not None and not isinstance(ro, bool):
            raise ValidationError("readOnlyRootFilesystem: must be a boolean")
        dep = cls(
            service=service,
            image=image.strip(),
            namespace=namespace or None,
            envProcess=env_process or None,
            envVars=_str_map(body, "envVars"),
            constraints=_str_list(body, "constraints"),
            secrets=_str_list(body, "secrets"),
            labels=_str_map(body, "labels"),
            annotations=_str_map(body, "annotations"),
            limits=_str_map(body, "limits"),
            requests=_str_map(body, "requests"),
            readOnlyRootFilesystem=ro,
        )
        validate_deployment(
            service=dep.service,
            namespace=dep.namespace,
            env_process=dep.envProcess,
            env_vars=dep.envVars,
            secrets=dep.secrets,
            constraints=dep.constraints,
            labels=dep.labels,
            annotations=dep.annotations,
            limits=dep.limits,
            requests=dep.requests,
        )
        return dep

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v not in (None, {}, [])}
        return out

    def scale_bounds(self) -> tuple[int, int]:
        """(min, max) replicas from com.openfaas.scale.min/max (OpenFaaS defaults 1 and 20)."""
        return _scale_bounds(self.labels)

    def slo_ms(self) -> float | None:
        """The SLO a call without `X-Faas-Gpu-Slo-Ms` has (`com.faas-gpu.slo-ms`, validated at
        deploy); None without one, or when the function's calls are best effort by default."""
        notes = self.annotations or {}
        if notes.get(CLASS_ANNOTATION, "").strip().lower() == RequestClass.BEST_EFFORT.value:
            return None
        try:
            return float(notes[SLO_ANNOTATION])
        except (KeyError, ValueError):
            return None


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def go_float(value: float) -> int | float:
    """A float64 as Go's encoding/json writes it: a whole number without a fraction (`1`, not
    Python's `1.0`; Go switches to an exponent only past 1e21, where an int is exact anyway)."""
    number = float(value)
    return int(number) if number.is_integer() and abs(number) < 1e21 else number


@dataclass
class FunctionRecord:
    """What the provider persists per function: the deployment, desired replicas, creation time,
    and the version before this one (what `faas-gpu rollback` deploys again)."""

    deployment: FunctionDeployment
    namespace: str
    replicas: int
    created_at: str = field(default_factory=now_rfc3339)
    previous: FunctionDeployment | None = None

    @property
    def name(self) -> str:
        return self.deployment.service

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def to_json(self) -> dict[str, Any]:
        out = {
            "deployment": self.deployment.to_json(),
            "namespace": self.namespace,
            "replicas": self.replicas,
            "createdAt": self.created_at,
        }
        if self.previous is not None:
            out["previous"] = self.previous.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionRecord:
        previous = data.get("previous")
        return cls(
            deployment=FunctionDeployment.from_json(data["deployment"]),
            namespace=data["namespace"],
            replicas=int(data["replicas"]),
            created_at=data["createdAt"],
            previous=FunctionDeployment.from_json(previous) if previous is not None else None,
        )

    def status(self, available: int, invocations: float, usage: dict | None = None) -> dict[str, Any]:
        """FunctionStatus JSON, typed as function_status.go: invocationCount and the usage figures
        are float64 (written as Go writes them: `1`, `1.5`), replicas and availableReplicas uint64.
        The deployment's own fields are omitempty; the status figures are always present (Go would
        omit a 0, and every client reads a missing one as 0; ours read them without a default)."""
        dep = self.deployment.to_json()
        dep.pop("service")
        labels = dict(self.deployment.labels or {})
        labels["faas_function"] = self.name
        # labels and annotations always as objects, as faasd and faas-netes send them: the certifier
        # reads `annotations` without a check and stops the whole suite when it is missing
        out: dict[str, Any] = {"name": self.name, "annotations": {}, **dep, "namespace": self.namespace}
        out["labels"] = labels
        out.update(
            invocationCount=go_float(invocations),
            replicas=max(int(self.replicas), 0),
            availableReplicas=max(int(available), 0),
            createdAt=self.created_at,
        )
        if usage is not None:
            out["usage"] = {k: go_float(v) if isinstance(v, int | float) else v for k, v in usage.items()}
        return out
