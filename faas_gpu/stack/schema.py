"""The stack file's schema: which keys each level may hold, their types, and the parsed model.

`load_stack` reads a file (through `text`: ${VAR} substitution and YAML as Go reads it) into a
`StackFile` of `FunctionSpec`s; every check names the file and the key path. Paths the file names
are checked by `files.resolve_inside`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faas_gpu.contract import annotations as ann

from .files import display_name, resolve_inside
from .text import StackError, envsubst, parse_yaml

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DEFAULT_GATEWAY = "http://127.0.0.1:8080"
VALID_VERSIONS = ("1.0",)
PROVIDER_NAME = "openfaas"

TOP_KEYS = ("version", "provider", "functions", "configuration")
PROVIDER_KEYS = ("name", "gateway", "network")
CONFIGURATION_KEYS = ("templates", "copy")
TEMPLATE_SOURCE_KEYS = ("name", "source")
FUNCTION_KEYS = (
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
)
RESOURCE_KEYS = ("memory", "cpu")
LANG_RE = re.compile(r"^[A-Za-z0-9][-._A-Za-z0-9]*$")  # a template folder's name, never a path
GPU_ANNOTATION = ann.GPU

_TRUE = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y"}
_FALSE = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N"}


# -- the model -------------------------------------------------------------------------------
@dataclass
class FunctionSpec:
    """One entry of `functions:` with faas-cli's field names (snake_case as in the YAML)."""

    name: str
    image: str
    lang: str | None = None
    handler: str | None = None
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
    build_args: dict[str, str] = field(default_factory=dict)
    build_options: list[str] = field(default_factory=list)
    build_secrets: dict[str, str] = field(default_factory=dict)
    platforms: str | None = None
    stack_dir: Path = field(default_factory=Path.cwd)
    copy: list[str] = field(default_factory=list)  # configuration.copy, shared by every function

    def to_deployment(self) -> dict[str, Any]:
        """The FunctionDeployment JSON faas-cli sends (faas-provider field names), empty fields left out."""
        dep: dict[str, Any] = {
            "service": self.name,
            "image": self.image,
            "namespace": self.namespace,
            "envProcess": self.fprocess,
            "envVars": dict(self.environment),
            "constraints": list(self.constraints),
            "secrets": list(self.secrets),
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "limits": dict(self.limits),
            "requests": dict(self.requests),
            "readOnlyRootFilesystem": self.readonly_root_filesystem or None,
        }
        return {k: v for k, v in dep.items() if v not in (None, "", {}, [])}


@dataclass
class StackFile:
    """A parsed stack file. `gateway` is provider.gateway normalised (lower case, no trailing /),
    DEFAULT_GATEWAY when absent."""

    path: Path
    functions: dict[str, FunctionSpec]
    gateway: str = DEFAULT_GATEWAY
    version: str | None = "1.0"
    network: str | None = None
    templates: list[dict[str, str]] = field(default_factory=list)
    copy: list[str] = field(default_factory=list)

    @property
    def stack_dir(self) -> Path:
        return self.path.parent.resolve()

    @classmethod
    def load(cls, path: Path | str, *, envsubst: bool = True, env: Mapping[str, str] | None = None) -> StackFile:
        return load_stack(path, env=env, substitute=envsubst)

    def select(self, name: str | None = None) -> list[FunctionSpec]:
        """All functions, or the one `--filter NAME` names (an error naming the file if absent)."""
        if name is None:
            return list(self.functions.values())
        if name not in self.functions:
            have = ", ".join(self.functions) or "none"
            raise StackError(f"{display_name(self.path)}: functions.{name}: no such function (have: {have})")
        return [self.functions[name]]


Stack = StackFile  # the older name, still used by callers


class _Reader:
    """Typed access to YAML values; every failure names the file and the key path."""

    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, message: str):
        raise StackError(f"{self.file}: {key}: {message}" if key else f"{self.file}: {message}")

    def keys(self, data: dict, allowed: tuple[str, ...], where: str) -> None:
        unknown = [str(k) for k in data if k not in allowed]
        if len(unknown) == 1:
            self.fail(_join(where, unknown[0]), f"unknown key (known keys: {', '.join(allowed)})")
        if unknown:
            self.fail(where, f"unknown keys {', '.join(unknown)} (known keys: {', '.join(allowed)})")

    def mapping(self, data: dict, key: str, where: str) -> dict:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(_join(where, key), "must be a mapping")
        return value

    def str_(self, data: dict, key: str, where: str, required: bool = False) -> str | None:
        value = data.get(key)
        if value is None or value == "":
            if required:
                self.fail(_join(where, key), "is required")
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.fail(_join(where, key), "must be a string")
        return str(value)

    def map_(self, data: dict, key: str, where: str) -> dict[str, str]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(_join(where, key), "must be a mapping of strings")
        out = {}
        for k, v in value.items():
            if v is None:
                v = ""
            if isinstance(v, dict | list):
                self.fail(_join(where, key, str(k)), "must be a string")
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def list_(self, data: dict, key: str, where: str) -> list[str]:
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(_join(where, key), "must be a list of strings")
        for i, v in enumerate(value):
            if not isinstance(v, str | int | float) or isinstance(v, bool):
                self.fail(f"{_join(where, key)}[{i}]", "must be a string")
        return [str(v) for v in value]

    def bool_(self, data: dict, key: str, where: str) -> bool:
        value = data.get(key)
        if value is None or isinstance(value, bool):
            return bool(value)
        if isinstance(value, str) and value in _TRUE:
            return True
        if isinstance(value, str) and value in _FALSE:
            return False
        self.fail(_join(where, key), f"must be true or false, got {value!r}")


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def load_stack(path: Path | str, *, env: Mapping[str, str] | None = None, substitute: bool = True) -> StackFile:
    """Parse a stack file; `substitute=False` is faas-cli's `--envsubst=false`."""
    path = Path(path)
    file = display_name(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise StackError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StackError(f"{file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if substitute:
        text = envsubst(text, os.environ if env is None else env)
    data = parse_yaml(text, file)
    r = _Reader(file)
    if not isinstance(data, dict):
        r.fail("", "must be a mapping with version, provider and functions")
    r.keys(data, TOP_KEYS, "")

    version = r.str_(data, "version", "")
    if version is not None and version not in VALID_VERSIONS:
        r.fail("version", f"must be 1.0, got {version!r}")

    provider = data.get("provider")
    if provider is None:
        r.fail("provider", f"is required (name: {PROVIDER_NAME}, gateway: URL)")
    if not isinstance(provider, dict):
        r.fail("provider", "must be a mapping (name: openfaas, gateway: URL)")
    r.keys(provider, PROVIDER_KEYS, "provider")
    name = r.str_(provider, "name", "provider")
    if name != PROVIDER_NAME:
        r.fail("provider.name", f"must be {PROVIDER_NAME} (the only provider name faas-cli accepts), got {name!r}")
    gateway = (r.str_(provider, "gateway", "provider") or DEFAULT_GATEWAY).lower().rstrip("/")

    config = r.mapping(data, "configuration", "")
    r.keys(config, CONFIGURATION_KEYS, "configuration")
    templates = []
    raw_templates = config.get("templates") or []
    if not isinstance(raw_templates, list):
        r.fail("configuration.templates", "must be a list of {name, source}")
    for i, t in enumerate(raw_templates):
        where = f"configuration.templates[{i}]"
        if not isinstance(t, dict):
            r.fail(where, "must be a mapping with name and source")
        r.keys(t, TEMPLATE_SOURCE_KEYS, where)
        templates.append({"name": r.str_(t, "name", where, required=True), "source": r.str_(t, "source", where) or ""})
    copy = r.list_(config, "copy", "configuration")
    for i, extra in enumerate(copy):
        resolve_inside(path.parent, extra, f"{file}: configuration.copy[{i}]")

    functions_raw = data.get("functions")
    if not isinstance(functions_raw, dict) or not functions_raw:
        r.fail("functions", "must be a mapping of one or more functions")
    stack_dir = path.parent.resolve()
    functions = {}
    for fn_name, fn in functions_raw.items():
        fn_name = str(fn_name)
        where = f"functions.{fn_name}"
        if not NAME_RE.match(fn_name):
            r.fail(where, f"invalid function name: must match {NAME_RE.pattern} (lower case letters, digits, '-')")
        if not isinstance(fn, dict):
            r.fail(where, "must be a mapping")
        functions[fn_name] = _function(r, fn_name, fn, where, stack_dir, copy)
    return StackFile(
        path=path,
        functions=functions,
        gateway=gateway,
        version=version,
        network=r.str_(provider, "network", "provider"),
        templates=templates,
        copy=copy,
    )


def _resources(r: _Reader, fn: dict, key: str, where: str) -> dict[str, str]:
    res = r.map_(fn, key, where)
    for k in res:
        if k.endswith("/gpu") or k == "gpu":
            r.fail(
                f"{where}.{key}.{k}",
                f"faas-cli drops GPU {key} before they reach the provider; "
                f'use the annotation {GPU_ANNOTATION}: "{res[k]}" instead',
            )
        if k not in RESOURCE_KEYS:
            r.fail(f"{where}.{key}.{k}", f"unknown resource (only {', '.join(RESOURCE_KEYS)})")
    return res


def _environment_files(r: _Reader, fn: dict, where: str, stack_dir: Path) -> dict[str, str]:
    """environment_file: files of the form `environment: {K: V}`, relative to the stack file, in order."""
    environment: dict[str, str] = {}
    for i, name in enumerate(r.list_(fn, "environment_file", where)):
        key = f"{where}.environment_file[{i}]"
        env_path = resolve_inside(stack_dir, name, f"{r.file}: {key}")
        try:
            text = env_path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            r.fail(key, f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}")
        try:
            loaded = parse_yaml(text, name)
        except StackError as exc:
            r.fail(key, str(exc))
        if loaded is None:
            continue
        if not isinstance(loaded, dict) or not isinstance(loaded.get("environment") or {}, dict):
            r.fail(key, f"{name} must hold `environment: {{KEY: value}}`")
        unknown = [str(k) for k in loaded if k != "environment"]
        if unknown:  # the key only when it is plainly a key: never a line of some other file
            shown = unknown[0] if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", unknown[0]) else "(not shown)"
            r.fail(key, f"{name}: unknown key {shown} (only environment)")
        environment.update(r.map_(loaded, "environment", f"{key}:{name}"))
    return environment


def _function(r: _Reader, name: str, fn: dict, where: str, stack_dir: Path, copy: list[str]) -> FunctionSpec:
    r.keys(fn, FUNCTION_KEYS, where)
    skip_build = r.bool_(fn, "skip_build", where)
    lang = r.str_(fn, "lang", where, required=not skip_build)
    if lang == "Dockerfile":  # faas-cli accepts both spellings
        lang = "dockerfile"
    if lang is not None and not LANG_RE.match(lang):
        r.fail(_join(where, "lang"), f"{lang!r} must name a template (letters, digits, '-', '.', '_'), not a path")
    handler = r.str_(fn, "handler", where, required=not skip_build)
    if handler is not None:
        resolve_inside(stack_dir, handler, f"{r.file}: {where}.handler")
    build_secrets = r.map_(fn, "build_secrets", where)
    for secret_id, src in build_secrets.items():
        resolve_inside(stack_dir, src, f"{r.file}: {where}.build_secrets.{secret_id}")
    image = r.str_(fn, "image", where, required=True)
    limits = _resources(r, fn, "limits", where)
    requests = _resources(r, fn, "requests", where)
    # faas-cli: environment_file first, then environment{} overrides it
    environment = _environment_files(r, fn, where, stack_dir)
    environment.update(r.map_(fn, "environment", where))
    return FunctionSpec(
        name=name,
        image=image,
        lang=lang,
        handler=handler,
        fprocess=r.str_(fn, "fprocess", where),
        namespace=r.str_(fn, "namespace", where),
        environment=environment,
        secrets=r.list_(fn, "secrets", where),
        labels=r.map_(fn, "labels", where),
        annotations=r.map_(fn, "annotations", where),
        constraints=r.list_(fn, "constraints", where),
        limits=limits,
        requests=requests,
        readonly_root_filesystem=r.bool_(fn, "readonly_root_filesystem", where),
        skip_build=skip_build,
        build_args=r.map_(fn, "build_args", where),
        build_options=r.list_(fn, "build_options", where),
        build_secrets=build_secrets,
        platforms=r.str_(fn, "platforms", where),
        stack_dir=stack_dir,
        copy=list(copy),
    )
