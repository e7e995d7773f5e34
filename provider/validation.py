"""Deploy-time validation of a FunctionDeployment: names, sizes, labels, annotations, resources.

Why a module of its own: a deploy that the provider accepts but cannot run (a 300-character
name that no file system stores, a 3 MB `envProcess` that `execve` refuses with E2BIG, an SLO of
`abc` the replica's GPU client crashes on) used to be stored with 202 and then broke every start
after it, even across restarts. Everything a replica will be built from is checked here, before
anything is stored, and again when records are read back (old records are never trusted).

Pure: no clock, files or network; every rule reads from the tables below, and each failure is a
`ValidationError` whose message starts with the field it names (`annotations: com.faas-gpu.slo-ms
...`), answered 400 by the provider. The rules of our own keys (`com.faas-gpu.*` annotations and
the `FAAS_GPU_*` variables they become) are part of the cross-process contract and live there
(`faas_gpu.contract.annotations`): the autoscalers, the runtime and the CLI read the same keys.

Limits and why:
- names (`service`, `namespace`): RFC 1123 labels, at most 63 characters, as Kubernetes and
  faas-netes; secret names: RFC 1123 subdomain-like, at most 253 characters, as Kubernetes.
- environment: every `NAME=value` string (and `envProcess`, which the watchdog receives as
  `fprocess`) at most 64 KiB, all of them together at most 256 KiB. Linux refuses one string above
  128 KiB (MAX_ARG_STRLEN) and the whole of argv + env above ARG_MAX (2 MiB by default), so these
  leave room for the daemon's own environment.
- `com.openfaas.scale.max` (and `.min`) at most MAX_REPLICAS (1000): faas-netes has no cap, but one
  node of local processes (or a cluster of GPU instances) cannot run more; a larger value is a typo.
  A `com.openfaas.scale.min` of 0 is read as faas-netes reads it (`getMinReplicaCount` ignores a
  value below 1): the default minimum, 1. Going to zero is `com.openfaas.scale.zero`.
- `com.openfaas.scale.zero` / `com.openfaas.scale.zero-duration`: OpenFaaS Pro's scale to zero (CE
  refuses them; faas-gpu runs them, `faas_gpu.policies.scale_zero`): true/false, and a Go duration
  from 1 s to MAX_ZERO_AFTER_S (15m when unset).
- SLOs and batch timeouts at most MAX_SLO_MS (one hour, the policies' bound on any SLO), batch
  sizes at most MAX_BATCH_SIZE (1024; both in `faas_gpu.contract`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from faas_gpu.contract import annotations as ann
from faas_gpu.contract.annotations import (  # noqa: F401 — the rules' home; names kept for callers
    APP_NAME_RE,
    MAX_GPUS,
    MODEL_NAME_RE,
    Check,
)
from faas_gpu.contract.annotations import show as _show
from faas_gpu.contract.duration import parse_duration
from faas_gpu.contract.errors import ValidationError
from faas_gpu.policies.scale_zero import DEFAULT_ZERO_AFTER_S

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LEN = 63
SECRET_NAME_RE = re.compile(r"^[a-zA-Z0-9]([-._a-zA-Z0-9]*[a-zA-Z0-9])?$")
MAX_SECRET_NAME_LEN = 253
ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")  # Kubernetes' rule for env var names
MAX_ENV_ENTRY_BYTES = 64 * 1024
MAX_ENV_TOTAL_BYTES = 256 * 1024
MAX_METADATA_BYTES = 256 * 1024  # labels and annotations together, as Kubernetes bounds annotations
MAX_LIST_ITEMS = 256  # secrets, constraints
MAX_ITEM_LEN = 1024  # one constraint
MAX_REPLICAS = 1000
RESOURCE_KEYS = ("memory", "cpu", "nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu")
# A Kubernetes quantity (apimachinery resource.Quantity): a number, then a binary suffix (Ki..Ei),
# a decimal one (n u m k M G T P E) or an exponent (e3, E-2).
QUANTITY_RE = re.compile(r"^\+?(?P<num>\d+(\.\d*)?|\.\d+)(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?$")
CE_FORBIDDEN_LABELS = (
    "com.openfaas.scale.target",
    "com.openfaas.scale.type",
)
"""OpenFaaS Pro's labels for its own autoscaler (rps/capacity/cpu targets), which faas-gpu does not run."""
SCALE_ZERO_LABEL = "com.openfaas.scale.zero"
SCALE_ZERO_DURATION_LABEL = "com.openfaas.scale.zero-duration"
MAX_ZERO_AFTER_S = 7 * 24 * 3600.0
SCALE_MIN_LABEL = "com.openfaas.scale.min"
SCALE_MAX_LABEL = "com.openfaas.scale.max"
SCALE_FACTOR_LABEL = "com.openfaas.scale.factor"
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 20
GATEWAY_MAX_REPLICAS = 5
"""The CE gateway's `scaling.DefaultMaxReplicas`: its scale route and alert handler stop here
when the function has no `com.openfaas.scale.max` (gateway/scaling/ranges.go)."""
DEFAULT_SCALE_FACTOR = 10
"""The CE gateway's `scaling.DefaultScalingFactor` (percent of the maximum per alert)."""
OURS = ann.PREFIX

ANNOTATIONS: dict[str, Check] = ann.CHECKS
"""Every `com.faas-gpu.*` key and its rule: `faas_gpu.contract.annotations.CHECKS`."""
ENV_VARS: dict[str, Check] = ann.ENV_CHECKS
"""envVars the replica reads at start: the same rules as the annotations they override."""

WATCHDOG_DURATIONS = ("read_timeout", "write_timeout", "exec_timeout", "healthcheck_interval", "upstream_timeout")
"""The watchdogs' timeouts (of-watchdog's and the classic one's): Go durations, refused beyond Go's
largest as `time.ParseDuration` refuses them (else stored, then every call failed in the replica)."""
WATCHDOG_COUNTS = ("max_inflight", "max_body_bytes")
"""The watchdogs' whole-number settings (0: none)."""


def _zero_duration(where: str, raw: str) -> None:
    ann.duration(where, raw)
    if not 1.0 <= parse_duration(raw.strip()) <= MAX_ZERO_AFTER_S:
        raise ValidationError(f"{where} must be from 1s to {MAX_ZERO_AFTER_S / 3600:g}h, got {_show(raw)}")


SCALE_LABELS: dict[str, Check] = {
    SCALE_MIN_LABEL: ann.integer(0, MAX_REPLICAS, "a whole number of replicas"),
    SCALE_MAX_LABEL: ann.integer(1, MAX_REPLICAS, "a whole number of replicas"),
    SCALE_FACTOR_LABEL: ann.integer(0, 100, "a percentage"),
    SCALE_ZERO_LABEL: ann.flag,
    SCALE_ZERO_DURATION_LABEL: _zero_duration,
}
"""The OpenFaaS scaling labels faas-gpu honours (CE's, and Pro's scale to zero); CE_FORBIDDEN_LABELS
are refused outright."""


def validate_name(name: Any, field_name: str = "service") -> str:
    """An RFC 1123 label of at most 63 characters: it becomes a folder and a process name."""
    if not isinstance(name, str) or not name:
        raise ValidationError(f"{field_name}: is required")
    if len(name) > MAX_NAME_LEN:
        raise ValidationError(f"{field_name}: must be at most {MAX_NAME_LEN} characters, got {len(name)}")
    if not NAME_RE.match(name):
        raise ValidationError(
            f"{field_name}: {_show(name)} is not a valid name (lower case letters, digits and '-', RFC 1123)"
        )
    return name


def validate_secret_name(name: Any, field_name: str = "name") -> str:
    if not isinstance(name, str) or not name:
        raise ValidationError(f"{field_name}: is required")
    if len(name) > MAX_SECRET_NAME_LEN:
        raise ValidationError(f"{field_name}: a secret name must be at most {MAX_SECRET_NAME_LEN} characters")
    if not SECRET_NAME_RE.match(name):
        raise ValidationError(f"{field_name}: {_show(name)} is not a valid secret name")
    return name


def parse_quantity(where: str, raw: str) -> Decimal:
    """A Kubernetes quantity (`512Mi`, `0.5`, `250m`, `1e3`) as a plain number; negative refused."""
    m = QUANTITY_RE.match(raw.strip())
    if not m:
        raise ValidationError(f"{where} must be a Kubernetes quantity such as 512Mi, 1Gi, 500m or 2, got {_show(raw)}")
    suffix = m.group("suffix") or ""
    binary = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
    decimal = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    try:
        number = Decimal(m.group("num"))
        if suffix in binary:
            return number * (2 ** binary[suffix])
        exponent = decimal[suffix] if suffix in decimal else int(suffix[1:])
        if abs(exponent) > 30:
            raise InvalidOperation
        return number.scaleb(exponent)
    except (InvalidOperation, ValueError):
        raise ValidationError(f"{where} is out of range, got {_show(raw)}") from None


def _resources(where: str, values: Mapping[str, str]) -> None:
    for key, raw in values.items():
        if key not in RESOURCE_KEYS:
            raise ValidationError(f"{where}: unknown resource {key!r} (known: {', '.join(RESOURCE_KEYS)})")
        value = parse_quantity(f"{where}.{key}", raw)
        if key.endswith("/gpu") and (value != value.to_integral_value() or value > MAX_GPUS):
            raise ValidationError(f"{where}.{key} must be a whole number of GPUs up to {MAX_GPUS}, got {_show(raw)}")


def _environment(env_vars: Mapping[str, str], env_process: str | None) -> None:
    total = 0
    for name, value in env_vars.items():
        where = f"envVars.{name[:40]}"
        if not ENV_NAME_RE.match(name):
            raise ValidationError(f"{where}: {_show(name)} is not a valid environment variable name")
        if "\0" in value:
            raise ValidationError(f"{where} must not contain a NUL character")
        size = len(name.encode()) + 1 + len(value.encode())
        if size > MAX_ENV_ENTRY_BYTES:
            raise ValidationError(f"{where} is {size} bytes; at most {MAX_ENV_ENTRY_BYTES} bytes per variable")
        if name in ENV_VARS:
            ENV_VARS[name](where, value)
        elif name in WATCHDOG_DURATIONS:
            try:
                parse_duration(value, where)
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
        elif name in WATCHDOG_COUNTS and not re.fullmatch(r"\d{1,18}", value.strip()):
            raise ValidationError(f"{where}: {_show(value)} is not a whole number of at most 18 digits")
        total += size
    if env_process is not None:
        size = len(env_process.encode())
        if "\0" in env_process:
            raise ValidationError("envProcess: must not contain a NUL character")
        if size > MAX_ENV_ENTRY_BYTES:
            raise ValidationError(f"envProcess: is {size} bytes; at most {MAX_ENV_ENTRY_BYTES} bytes")
        total += size
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValidationError(
            f"envVars: with envProcess, {total} bytes of environment; at most {MAX_ENV_TOTAL_BYTES} bytes in all"
        )


def _metadata(field_name: str, values: Mapping[str, str]) -> int:
    size = 0
    for key, raw in values.items():
        where = f"{field_name}: {key[:80]}"
        if not key or "\0" in key or "\0" in raw:
            raise ValidationError(f"{where}: keys must be non-empty and neither key nor value may contain NUL")
        if key.startswith(OURS):
            ann.check(where, key, raw)
        if field_name == "labels":
            if key in CE_FORBIDDEN_LABELS:
                raise ValidationError(
                    f"labels: {key} is OpenFaaS Pro's autoscaler target, which faas-gpu does not run (its policies "
                    "are plain replicas with CE's alert rule, INFless, HarmonyBatch and PROTEAN)"
                )
            if key in SCALE_LABELS:
                SCALE_LABELS[key](where, raw)
        size += len(key.encode()) + len(raw.encode())
    return size


def scale_bounds(labels: Mapping[str, str] | None) -> tuple[int, int]:
    """(min, max) replicas from com.openfaas.scale.min/max (OpenFaaS defaults 1 and 20); a minimum of
    0 is the default 1, as faas-netes reads it (scale to zero is `com.openfaas.scale.zero`)."""
    labels = labels or {}
    bounds = []
    for key, default in ((SCALE_MIN_LABEL, DEFAULT_MIN_REPLICAS), (SCALE_MAX_LABEL, DEFAULT_MAX_REPLICAS)):
        raw = labels.get(key)
        if raw is None:
            bounds.append(default)
            continue
        SCALE_LABELS[key](f"labels: {key}", raw)
        bounds.append(int(raw.strip()) or default)
    lo, hi = bounds
    if lo > hi:
        raise ValidationError(f"labels: {SCALE_MIN_LABEL} ({lo}) exceeds {SCALE_MAX_LABEL} ({hi})")
    return lo, hi


def validate_deployment(
    *,
    service: str,
    namespace: str | None,
    env_process: str | None,
    env_vars: Mapping[str, str] | None,
    secrets: list[str] | None,
    constraints: list[str] | None,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    limits: Mapping[str, str] | None,
    requests: Mapping[str, str] | None,
) -> None:
    """Every rule above, in the order a reader of the JSON meets the fields; the first failure raises."""
    validate_name(service, "service")
    if namespace:
        validate_name(namespace, "namespace")
    _environment(env_vars or {}, env_process)
    for field_name, items in (("secrets", secrets), ("constraints", constraints)):
        if items and len(items) > MAX_LIST_ITEMS:
            raise ValidationError(f"{field_name}: at most {MAX_LIST_ITEMS} entries, got {len(items)}")
    for s in secrets or ():
        validate_secret_name(s, "secrets")
    for c in constraints or ():
        if len(c) > MAX_ITEM_LEN or "\0" in c:
            raise ValidationError(f"constraints: each must be at most {MAX_ITEM_LEN} characters, without NUL")
    size = _metadata("labels", labels or {}) + _metadata("annotations", annotations or {})
    if size > MAX_METADATA_BYTES:
        raise ValidationError(f"annotations: labels and annotations are {size} bytes; at most {MAX_METADATA_BYTES}")
    scale_bounds(labels)
    _resources("limits", limits or {})
    _resources("requests", requests or {})


def zero_after_s(labels: Mapping[str, str] | None) -> float | None:
    """Seconds without a call after which the function goes to zero (`com.openfaas.scale.zero:
    "true"`, after `com.openfaas.scale.zero-duration`, 15m by default), or None: it never does."""
    labels = labels or {}
    raw = labels.get(SCALE_ZERO_LABEL)
    if raw is None:
        return None
    SCALE_LABELS[SCALE_ZERO_LABEL](f"labels: {SCALE_ZERO_LABEL}", raw)
    if not ann.is_true(raw, default=False):
        return None
    duration = labels.get(SCALE_ZERO_DURATION_LABEL)
    if duration is None:
        return DEFAULT_ZERO_AFTER_S
    SCALE_LABELS[SCALE_ZERO_DURATION_LABEL](f"labels: {SCALE_ZERO_DURATION_LABEL}", duration)
    return parse_duration(duration.strip())


def gateway_scale_bounds(labels: Mapping[str, str] | None) -> tuple[int, int]:
    """(min, max) replicas on the gateway routes: the labels, else the CE gateway's 1 and 5.

    The CE gateway (gateway/scaling/ranges.go) clamps every scale request to 1..5 whatever the
    labels say, and its alert handler to min(label max, 5); here a `com.openfaas.scale.max` above
    5 is honoured (the label states the user's intent and the provider API honours it), and only
    its absence means CE's 5. A minimum above 5 with no maximum keeps the range non-empty."""
    lo, _hi = scale_bounds(labels)
    raw_max = (labels or {}).get(SCALE_MAX_LABEL)
    hi = int(raw_max.strip()) if raw_max is not None else max(lo, GATEWAY_MAX_REPLICAS)
    return lo, hi


def scale_factor(labels: Mapping[str, str] | None) -> int:
    """`com.openfaas.scale.factor` (validated 0..100 at deploy), else CE's 10; 0 turns alert scaling off
    (the CE gateway's service query refuses a factor outside 1..100 and the alert then changes nothing)."""
    raw = (labels or {}).get(SCALE_FACTOR_LABEL)
    if raw is None:
        return DEFAULT_SCALE_FACTOR
    SCALE_LABELS[SCALE_FACTOR_LABEL](f"labels: {SCALE_FACTOR_LABEL}", raw)
    return int(raw.strip())


def clamp_replicas(requested: int, bounds: tuple[int, int]) -> tuple[int, str | None]:
    """`requested` held within (min, max), and a message saying so when it had to be moved."""
    lo, hi = bounds
    if requested > hi:
        return hi, f"replicas: {requested} is above {SCALE_MAX_LABEL} ({hi}); scaled to {hi}"
    if requested < lo:
        return lo, f"replicas: {requested} is below {SCALE_MIN_LABEL} ({lo}); scaled to {lo}"
    return requested, None
