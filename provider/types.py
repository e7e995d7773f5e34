"""faas-provider JSON types, validated: FunctionDeployment in, FunctionStatus out.

Field names are exactly those of faas-provider/types (function_deployment.go, function_status.go).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SECRET_NAME_RE = re.compile(r"^[a-zA-Z0-9]([-._a-zA-Z0-9]*[a-zA-Z0-9])?$")
RESOURCE_KEYS = ("memory", "cpu", "nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu")
CE_FORBIDDEN_LABELS = (
    "com.openfaas.scale.zero",
    "com.openfaas.scale.zero-duration",
    "com.openfaas.scale.target",
    "com.openfaas.scale.type",
)
SCALE_MIN_LABEL = "com.openfaas.scale.min"
SCALE_MAX_LABEL = "com.openfaas.scale.max"
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 20


class ValidationError(ValueError):
    """Bad input from a client: answered 400 with this message, which names the field."""


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


def _resources(body: dict, key: str) -> dict[str, str] | None:
    value = _str_map(body, key)
    if value is None:
        return None
    unknown = sorted(set(value) - set(RESOURCE_KEYS))
    if unknown:
        raise ValidationError(f"{key}: unknown resource {unknown[0]!r} (known: {', '.join(RESOURCE_KEYS)})")
    return value


def validate_name(name: Any, field_name: str = "service") -> str:
    if not isinstance(name, str) or not name:
        raise ValidationError(f"{field_name}: is required")
    if not NAME_RE.match(name):
        raise ValidationError(
            f"{field_name}: {name!r} is not a valid function name (lower case letters, digits and '-', RFC 1123)"
        )
    return name


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
        labels = _str_map(body, "labels")
        for forbidden in CE_FORBIDDEN_LABELS:
            if labels and forbidden in labels:
                raise ValidationError(f"labels: {forbidden} is not supported in OpenFaaS CE")
        secrets = _str_list(body, "secrets")
        for s in secrets or ():
            if not SECRET_NAME_RE.match(s):
                raise ValidationError(f"secrets: {s!r} is not a valid secret name")
        dep = cls(
            service=service,
            image=image.strip(),
            namespace=namespace or None,
            envProcess=env_process or None,
            envVars=_str_map(body, "envVars"),
            constraints=_str_list(body, "constraints"),
            secrets=secrets,
            labels=labels,
            annotations=_str_map(body, "annotations"),
            limits=_resources(body, "limits"),
            requests=_resources(body, "requests"),
            readOnlyRootFilesystem=ro,
        )
        dep.scale_bounds()  # validates the scale labels now, not at the first scale
        return dep

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v not in (None, {}, [])}
        return out

    def scale_bounds(self) -> tuple[int, int]:
        """(min, max) replicas from com.openfaas.scale.min/max (OpenFaaS defaults 1 and 20)."""
        labels = self.labels or {}

        def read(key: str, default: int) -> int:
            raw = labels.get(key)
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ValidationError(f"labels: {key} must be an integer, got {raw!r}") from None
            if value < 1:
                raise ValidationError(f"labels: {key} must be at least 1, got {value}")
            return value

        lo, hi = read(SCALE_MIN_LABEL, DEFAULT_MIN_REPLICAS), read(SCALE_MAX_LABEL, DEFAULT_MAX_REPLICAS)
        if lo > hi:
            raise ValidationError(f"labels: {SCALE_MIN_LABEL} ({lo}) exceeds {SCALE_MAX_LABEL} ({hi})")
        return lo, hi


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class FunctionRecord:
    """What the provider persists per function: the deployment, desired replicas, creation time."""

    deployment: FunctionDeployment
    namespace: str
    replicas: int
    created_at: str = field(default_factory=now_rfc3339)

    @property
    def name(self) -> str:
        return self.deployment.service

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def to_json(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment.to_json(),
            "namespace": self.namespace,
            "replicas": self.replicas,
            "createdAt": self.created_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionRecord:
        return cls(
            deployment=FunctionDeployment.from_json(data["deployment"]),
            namespace=data["namespace"],
            replicas=int(data["replicas"]),
            created_at=data["createdAt"],
        )

    def status(self, available: int, invocations: float, usage: dict | None = None) -> dict[str, Any]:
        """FunctionStatus JSON: omitempty everywhere but name and image, as function_status.go."""
        dep = self.deployment.to_json()
        dep.pop("service")
        labels = dict(self.deployment.labels or {})
        labels["faas_function"] = self.name
        out: dict[str, Any] = {"name": self.name, **dep, "namespace": self.namespace, "labels": labels}
        out.update(
            invocationCount=float(invocations),
            replicas=self.replicas,
            availableReplicas=available,
            createdAt=self.created_at,
        )
        if usage is not None:
            out["usage"] = usage
        return out
