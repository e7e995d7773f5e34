"""stack.yml, read as faas-cli 0.18 reads it (go-sdk stack/schema.go, stack.go).

Errors name the file and the key path, e.g. `stack.yml: functions.echo.labels: must be a mapping`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
DEFAULT_GATEWAY = "http://127.0.0.1:8080"
TOP_KEYS = {"version", "provider", "functions", "configuration", "stack"}
FUNCTION_KEYS = {
    "lang",
    "handler",
    "image",
    "fprocess",
    "namespace",
    "environment",
    "environment_file",
    "secrets",
    "labels",
    "annotations",
    "constraints",
    "limits",
    "requests",
    "readonly_root_filesystem",
    "skip_build",
    "build_options",
    "build_args",
    "build_secrets",
    "platforms",
}
RESOURCE_KEYS = {"memory", "cpu"}
GPU_KEYS = {"nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu", "gpu"}


class StackError(ValueError):
    pass


def envsubst(text: str, env: dict[str, str]) -> str:
    """${VAR}, ${VAR:-default} and $VAR, as faas-cli's --envsubst (on by default)."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in env and env[name] != "":
            return env[name]
        return m.group(2) if m.group(2) is not None else ""

    return _VAR.sub(repl, text)


@dataclass
class FunctionSpec:
    name: str
    lang: str | None
    handler: str | None
    image: str
    fprocess: str | None = None
    namespace: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    constraints: list[str] = field(default_factory=list)
    limits: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)
    readonly_root_filesystem: bool = False
    skip_build: bool = False
    stack_dir: Path = field(default_factory=Path.cwd)

    def to_deployment(self) -> dict[str, Any]:
        """FunctionDeployment JSON (faas-provider field names), empty fields left out."""
        dep: dict[str, Any] = {
            "service": self.name,
            "image": self.image,
            "namespace": self.namespace,
            "envProcess": self.fprocess,
            "envVars": self.environment,
            "constraints": self.constraints,
            "secrets": self.secrets,
            "labels": self.labels,
            "annotations": self.annotations,
            "limits": self.limits,
            "requests": self.requests,
            "readOnlyRootFilesystem": self.readonly_root_filesystem or None,
        }
        return {k: v for k, v in dep.items() if v not in (None, "", {}, [])}


@dataclass
class Stack:
    path: Path
    gateway: str
    functions: dict[str, FunctionSpec]
    templates: list[dict[str, str]] = field(default_factory=list)

    def select(self, name: str | None) -> list[FunctionSpec]:
        if name is None:
            return list(self.functions.values())
        if name not in self.functions:
            raise StackError(
                f"{self.path.name}: functions.{name}: no such function (have: {', '.join(self.functions)})"
            )
        return [self.functions[name]]


def find_stack_file(explicit: str | None, cwd: Path | None = None) -> Path | None:
    """faas-cli's default: ./stack.yaml, else ./stack.yml."""
    if explicit:
        return Path(explicit)
    cwd = cwd or Path.cwd()
    for name in ("stack.yaml", "stack.yml"):
        if (cwd / name).is_file():
            return cwd / name
    return None


class _Reader:
    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, message: str):
        raise StackError(f"{self.file}: {key}: {message}")

    def str_(self, data: dict, key: str, where: str, required: bool = False) -> str | None:
        value = data.get(key)
        if value is None:
            if required:
                self.fail(f"{where}.{key}", "is required")
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.fail(f"{where}.{key}", "must be a string")
        return str(value)

    def map_(self, data: dict, key: str, where: str) -> dict[str, str]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(f"{where}.{key}", "must be a mapping of strings")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, dict | list) or v is None:
                self.fail(f"{where}.{key}.{k}", "must be a string")
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def list_(self, data: dict, key: str, where: str) -> list[str]:
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(f"{where}.{key}", "must be a list of strings")
        return list(value)

    def bool_(self, data: dict, key: str, where: str) -> bool:
        value = data.get(key, False)
        if not isinstance(value, bool):
            self.fail(f"{where}.{key}", "must be true or false")
        return value


def load_stack(path: Path | str, *, env: dict[str, str] | None = None, substitute: bool = True) -> Stack:
    path = Path(path)
    file = path.name
    try:
        text = path.read_text()
    except OSError as exc:
        raise StackError(f"{path}: cannot read: {exc.strerror}") from None
    env = dict(os.environ if env is None else env)
    if substitute:
        text = envsubst(text, env)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "syntax"
        raise StackError(f"{file}: {where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    r = _Reader(file)
    if not isinstance(data, dict):
        raise StackError(f"{file}: the stack file must be a mapping with version, provider and functions")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        r.fail(unknown[0], f"unknown key (expected one of {', '.join(sorted(TOP_KEYS))})")
    version = data.get("version")
    if str(version) != "1.0":
        r.fail("version", f"must be 1.0, got {version!r}")
    provider = data.get("provider")
    if not isinstance(provider, dict):
        r.fail("provider", "is required (name: openfaas, gateway: URL)")
    if provider.get("name") != "openfaas":
        r.fail("provider.name", f"must be openfaas, got {provider.get('name')!r}")
    gateway = r.str_(provider, "gateway", "provider") or DEFAULT_GATEWAY
    functions_raw = data.get("functions")
    if not isinstance(functions_raw, dict) or not functions_raw:
        r.fail("functions", "must be a mapping of one or more functions")
    functions = {}
    for name, fn in functions_raw.items():
        where = f"functions.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            r.fail(where, "invalid function name (lower case letters, digits and '-', RFC 1123)")
        if not isinstance(fn, dict):
            r.fail(where, "must be a mapping")
        functions[name] = _function(r, name, fn, where, path.parent.resolve())
    templates = []
    config = data.get("configuration") or {}
    if not isinstance(config, dict):
        r.fail("configuration", "must be a mapping")
    for i, t in enumerate(config.get("templates") or []):
        if not isinstance(t, dict) or "name" not in t:
            r.fail(f"configuration.templates[{i}]", "must have a name")
        templates.append({"name": str(t["name"]), "source": str(t.get("source", ""))})
    return Stack(path, gateway.lower().rstrip("/"), functions, templates)


def _function(r: _Reader, name: str, fn: dict, where: str, stack_dir: Path) -> FunctionSpec:
    unknown = sorted(set(fn) - FUNCTION_KEYS)
    if unknown:
        r.fail(f"{where}.{unknown[0]}", "unknown key")
    skip_build = r.bool_(fn, "skip_build", where)
    lang = r.str_(fn, "lang", where, required=not skip_build)
    handler = r.str_(fn, "handler", where, required=not skip_build)
    image = r.str_(fn, "image", where, required=True)
    for key in ("limits", "requests"):
        res = r.map_(fn, key, where)
        gpu = sorted(set(res) & GPU_KEYS)
        if gpu:
            r.fail(
                f"{where}.{key}.{gpu[0]}",
                "faas-cli drops GPU limits; use the annotation com.faas-gpu.gpu instead",
            )
        extra = sorted(set(res) - RESOURCE_KEYS)
        if extra:
            r.fail(f"{where}.{key}.{extra[0]}", "unknown resource (memory, cpu)")
    environment: dict[str, str] = {}
    for i, env_file in enumerate(r.list_(fn, "environment_file", where)):
        env_path = stack_dir / env_file
        try:
            loaded = yaml.safe_load(env_path.read_text()) or {}
        except OSError:
            r.fail(f"{where}.environment_file[{i}]", f"cannot read {env_file}")
        except yaml.YAMLError:
            r.fail(f"{where}.environment_file[{i}]", f"{env_file} is not valid YAML")
        if not isinstance(loaded, dict) or not isinstance(loaded.get("environment", {}), dict):
            r.fail(f"{where}.environment_file[{i}]", f"{env_file} must hold `environment: {{KEY: value}}`")
        environment.update(r.map_(loaded, "environment", f"{env_file}"))
    environment.update(r.map_(fn, "environment", where))
    return FunctionSpec(
        name=name,
        lang=lang,
        handler=handler,
        image=image,
        fprocess=r.str_(fn, "fprocess", where),
        namespace=r.str_(fn, "namespace", where),
        environment=environment,
        secrets=r.list_(fn, "secrets", where),
        labels=r.map_(fn, "labels", where),
        annotations=r.map_(fn, "annotations", where),
        constraints=r.list_(fn, "constraints", where),
        limits=r.map_(fn, "limits", where),
        requests=r.map_(fn, "requests", where),
        readonly_root_filesystem=r.bool_(fn, "readonly_root_filesystem", where),
        skip_build=skip_build,
        stack_dir=stack_dir,
    )
