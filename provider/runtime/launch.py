"""How a function's record becomes a command line: the watchdog, its env, its working folder.

Apart from the supervisor so what a replica runs with (and why a record cannot run at all) is
read in one place; the supervisor only starts, watches and stops what this plans.

The env is clean, as faasd gives a function: a standard PATH (with the function's environment's
`bin` first), `fprocess`, the watchdog's variables, the GPU client's, and the function's own
`envVars`; nothing of the stack's environment but the few settings its instances run with on
purpose (`STACK_ENV`: the import path of the stack's own code, OpenMP's threads, OpenTelemetry's
exporter). The runtime adds what depends on the replica (its port, HOME, where its token is).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from faas_gpu import paths
from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.contract import env as contract_env
from faas_gpu.contract.replica import STANDARD_PATH
from faas_gpu.imagestore import ImageStore

from ..config import parse_duration
from ..store import SecretStore
from ..types import FunctionRecord
from .base import LaunchError

CLASSIC_WATCHDOG = paths.TEMPLATES_DIR / "python3-gpu" / "fwatchdog.py"
STACK_ENV = ("PYTHONPATH", "OMP_NUM_THREADS")
"""The stack's settings its instances run with: where the stack's own code is imported from (a
checkout's), and OpenMP's threads. Nothing else of the stack's environment reaches a replica."""
STACK_ENV_PREFIXES = ("OTEL_",)
"""The stack's tracing reaches its instances (`faas_gpu.tracing`), under their own service name
(the traces file, FAAS_GPU_TRACES_FILE, is opened for them by the runtime)."""
MAX_ARG_STRLEN = 131072  # Linux: one exec argument or environment string (`fprocess=...`)

SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".ts", ".rb", ".pl", ".php", ".sh", ".jar")
BUILD_HINT = (
    "build the function into that store with `faas-gpu build -f stack.yaml` (or `faas-cli build "
    "--shrinkwrap -f stack.yaml`, then `faas-gpu build -f stack.yaml`), then deploy again"
)
GPU_ANNOTATIONS = annotation_keys.TO_ENV  # the annotations an instance gets as its GPU client's variables


@dataclass
class LaunchSpec:
    argv: list[str]
    cwd: Path | None
    """The image's context; None: no image (the runtime gives the replica its HOME)."""
    env: dict[str, str]
    http_mode: bool
    stop_timeout_s: float
    digest: str
    image: Path | None = None
    """The image's folder in the image store (its context and its environment), None without one:
    what a sandboxed replica sees of the state folder, read-only."""


def plan_launch(
    record: FunctionRecord, *, images: ImageStore, secrets: SecretStore, gpu_env: dict[str, str]
) -> LaunchSpec:
    """The launch of `record`'s replicas; LaunchError names what keeps it from running here."""
    dep = record.deployment
    check_env_process(record)
    env_vars = dict(dep.envVars or {})
    base_env = stack_env()
    image = images.get(dep.image)
    folder = None
    if image is not None:
        fprocess = dep.envProcess or image.fprocess
        watchdog = Path(image.context) / "fwatchdog.py"
        if not watchdog.exists():
            watchdog = CLASSIC_WATCHDOG
        # the watchdog runs in the function's environment, as it does in the image: in inproc mode
        # the function's code and requirements are imported into its process
        python = Path(image.python)
        argv = [str(python) if python.exists() else sys.executable, str(watchdog)]
        cwd = Path(image.context)
        folder = Path(image.folder)
        base_env["PATH"] = replica_path(python.parent)
        image_env = dockerfile_env(cwd / "Dockerfile")
        mode = env_vars.get("mode") or image_env.get("mode") or "http"
        if "ready_path" in image_env:  # the template's readiness check (python3-gpu: handler loaded)
            base_env["ready_path"] = image_env["ready_path"]
        image_id = f"{image.image}@{getattr(image, 'created', '')}"
    elif dep.envProcess:
        try:
            words = shlex.split(dep.envProcess)
        except ValueError as exc:
            raise LaunchError(f"envProcess: {dep.envProcess[:80]!r} is not a command line ({exc})") from None
        path = replica_path(Path(sys.executable).parent)
        if not words or shutil.which(words[0], path=path) is None:
            raise LaunchError(
                f"image: {dep.image!r} is not in the image store {images.root} and envProcess "
                f"{dep.envProcess[:80]!r} is not runnable on this host (a replica's PATH is {path}); {BUILD_HINT}"
            )
        script = _missing_script(words)
        if script is not None:  # e.g. the template's `python index.py`: its code is in the image
            raise LaunchError(
                f"image: {dep.image!r} is not in the image store {images.root}, and envProcess "
                f"{dep.envProcess[:80]!r} runs {script!r}, which only a built image holds; {BUILD_HINT}"
            )
        fprocess, argv, cwd = dep.envProcess, [sys.executable, str(CLASSIC_WATCHDOG)], None
        base_env["PATH"] = replica_path(Path(sys.executable).parent)  # the environment its watchdog runs in
        mode = env_vars.get("mode", "classic")
        image_id = dep.image
    else:
        raise LaunchError(
            f"image: {dep.image!r} is not in the image store {images.root}; {BUILD_HINT} "
            "(or give an envProcess that runs on this host)"
        )
    stop_timeout = check_record(record, secrets)
    env = {
        **base_env,
        "PYTHONUNBUFFERED": "1",
        "fprocess": fprocess,
        "mode": mode,
        "metrics_port": "0",
        "bind_address": "127.0.0.1",
        "healthcheck_interval": "100ms",
        **gpu_env,
        **gpu_settings(dep.annotations or {}),
        **env_vars,
    }
    identity = json.dumps([record.deployment.to_json(), image_id], sort_keys=True).encode()
    digest = hashlib.sha256(identity).hexdigest()[:16]
    return LaunchSpec(argv, cwd, env, mode == "http", stop_timeout, digest, folder)


def replica_path(bin_dir: Path) -> str:
    """A replica's PATH: its environment's `bin` (the function's venv; the stack's for a function
    without an image, whose classic watchdog runs there), then a standard one."""
    return f"{bin_dir}{os.pathsep}{STANDARD_PATH}"


def stack_env() -> dict[str, str]:
    """What a replica's env starts from: a standard PATH and `STACK_ENV` (a function's own wins)."""
    env = {"PATH": STANDARD_PATH}
    env.update({k: os.environ[k] for k in STACK_ENV if os.environ.get(k)})
    env.update({k: v for k, v in os.environ.items() if k.startswith(STACK_ENV_PREFIXES) and k != "OTEL_SERVICE_NAME"})
    return env


def dockerfile_env(path: Path) -> dict[str, str]:
    """The `ENV` a Dockerfile sets (both forms, `k=v ...` and `k v`, lines continued with `\\`):
    what a replica of its image would have in a container, so that a process replica runs the
    watchdog mode its template chose (python3-gpu's `inproc`; an older build's `http`)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    env: dict[str, str] = {}
    for instruction in text.replace("\\\n", " ").splitlines():
        words = instruction.strip().split(None, 1)
        if len(words) != 2 or words[0].upper() != "ENV":
            continue
        try:
            tokens = shlex.split(words[1], comments=True)
        except ValueError:
            continue
        if tokens and "=" not in tokens[0]:
            env[tokens[0]] = " ".join(tokens[1:])
        else:
            env.update(t.split("=", 1) for t in tokens if "=" in t)
    return env


def check_env_process(record: FunctionRecord) -> None:
    """An envProcess longer than one environment string may be (checked before shlex, which is
    quadratic in the length: minutes for 3 MB)."""
    dep = record.deployment
    if dep.envProcess and len(dep.envProcess.encode()) >= MAX_ARG_STRLEN - len("fprocess="):
        raise LaunchError(
            f"envProcess: {len(dep.envProcess.encode())} bytes is over Linux's limit of "
            f"{MAX_ARG_STRLEN} bytes for one argument or environment string"
        )


def check_record(record: FunctionRecord, secrets: SecretStore) -> float:
    """What keeps a record from running whatever runs it (process or container): its watchdog
    timeouts, its request class, its secrets. Returns the replica's stop timeout (write_timeout
    and 5 s to exit)."""
    check_env_process(record)
    dep = record.deployment
    env_vars = dep.envVars or {}
    for timeout_key in ("read_timeout", "write_timeout", "exec_timeout"):
        if timeout_key in env_vars:
            try:
                parse_duration(env_vars[timeout_key], f"envVars.{timeout_key}")
            except ValueError as exc:
                raise LaunchError(str(exc)) from None
    klass = (dep.annotations or {}).get(annotation_keys.CLASS)
    if klass is not None and klass not in ("strict", "best-effort"):
        raise LaunchError(f"annotations: com.faas-gpu.class must be strict or best-effort, got {klass!r}")
    for secret in dep.secrets or ():
        if not secrets.exists(record.namespace, secret):
            raise LaunchError(f"secrets: secret {secret!r} not found in namespace {record.namespace}")
    return parse_duration(env_vars.get("write_timeout", "30s")) + 5.0


def gpu_settings(annotations: dict[str, str]) -> dict[str, str]:
    """The function's GPU settings (annotations, since faas-cli drops GPU limits) as the client's env.

    A `com.faas-gpu.max-batch` the user wrote is a ceiling: the instance's batch bound, which grows
    a planner's batch size under a load it did not foresee, is off for it (a function that says
    "batches of one" gets batches of one)."""
    out = {env: annotations[key] for key, env in GPU_ANNOTATIONS.items() if key in annotations}
    if annotation_keys.MAX_BATCH in annotations:
        out[contract_env.BATCH_BOUND.name] = "off"
    return out


def _missing_script(words: list[str]) -> str | None:
    """The relative script an interpreter command runs, or None: an image-less replica starts in
    an empty HOME of its own, where no script is. `python index.py` is what faas-cli sends for a
    python3-gpu function (the template's fprocess): without the built image, every invocation
    would answer 500 "can't open file .../index.py"; refused at deploy instead. `-c` / `-m` run
    no file."""
    for arg in words[1:]:
        if arg in ("-c", "-m", "-e", "--eval"):
            return None
        if arg.startswith("-"):
            continue
        path = Path(arg)
        if path.is_absolute() or not (arg.endswith(SCRIPT_SUFFIXES) or "/" in arg):
            return None
        return arg
    return None
