"""Every `FAAS_GPU_*` environment variable: its name, its one default and its parser.

Why one table: the provider writes most of these into an instance's environment (from the
function's annotations, or an autoscaler's per-instance plan) and the instance's GPU client reads
them; the daemons read a few of their own. A variable read in two places with two defaults
(`FAAS_GPU_MAX_BATCH` was "1" at one line of the client and "8" at another) is two settings.

Reading: `VAR.read(env)` gives the parsed value, or the default when the variable is unset or
empty; `VAR.is_set(env)` says whether the environment named a value at all. Deploy-time rules for
the variables a deploy may set live with the annotations they mirror (`annotations.ENV_CHECKS`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from .duration import parse_duration

T = TypeVar("T")


@dataclass(frozen=True)
class Var(Generic[T]):
    """One variable: `read` parses it (ValueError for a bad value), else gives `default`."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str = ""

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The value as written, stripped; None when unset or empty."""
        value = (os.environ if env is None else env).get(self.name)
        return value.strip() if value is not None and value.strip() else None

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        return self.raw(env) is not None

    def read(self, env: Mapping[str, str] | None = None) -> T:
        raw = self.raw(env)
        return self.default if raw is None else self.parse(raw)


def _text(raw: str) -> str | None:
    return raw


def _urls(raw: str) -> tuple[str, ...]:
    return tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())


def on_off(raw: str) -> bool:
    """ "on"/"off" (also 1/0, true/false, yes/no), case-insensitive; ValueError otherwise."""
    value = raw.strip().lower()
    if value in ("on", "1", "true", "yes"):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"expected on or off, got {raw!r}")


def app_timeouts_ms(raw: str) -> dict[str, float]:
    """ "app=ms,app=ms" -> {app: seconds}; items without a name or a value are skipped."""
    out: dict[str, float] = {}
    for item in raw.split(","):
        name, _, ms = item.partition("=")
        if name.strip() and ms.strip():
            out[name.strip()] = float(ms) / 1000
    return out


# -- the state folder and the datastore (daemons and CLI) -------------------------------------
HOME: Var[Path | None] = Var("FAAS_GPU_HOME", None, Path, "state folder (default ./.faas-gpu; `faas_gpu.paths`)")
ETCD: Var[str | None] = Var("FAAS_GPU_ETCD", None, _text, "etcd URL (default: the embedded datastore)")
REDIS: Var[str | None] = Var("FAAS_GPU_REDIS", None, _text, "Redis URL of the async queue (default: embedded)")
ETCD_CREDENTIALS: Var[Path | None] = Var(
    "FAAS_GPU_ETCD_CREDENTIALS",
    None,
    Path,
    "a file holding the daemons' etcd login, user:password (`--etcd-credentials`; default the state "
    "folder's secrets/etcd-credentials when it exists, else the URL's userinfo)",
)
REDIS_CREDENTIALS: Var[Path | None] = Var(
    "FAAS_GPU_REDIS_CREDENTIALS",
    None,
    Path,
    "a file holding the daemons' Redis login, user:password or a password alone (`--redis-credentials`; "
    "default the state folder's secrets/redis-credentials when it exists, else the URL's userinfo)",
)

TRACES_FILE: Var[Path | None] = Var(
    "FAAS_GPU_TRACES_FILE",
    None,
    Path,
    "a JSON-lines file every daemon and instance appends its finished spans to (`faas_gpu.tracing`; "
    "beside or instead of OpenTelemetry's OTLP exporter), for tests and a stack without a collector",
)

SUPERVISOR_HOME: Var[Path | None] = Var(
    "FAAS_GPU_SUPERVISOR_HOME",
    None,
    Path,
    "set by `faas-gpu up`'s supervisor on the daemons it starts: each starts the supervisor of that state folder "
    "again when it dies (`faas_gpu.supervise`)",
)

# -- the provider -------------------------------------------------------------------------------
CPUS: Var[float | None] = Var("FAAS_GPU_CPUS", None, float, "cores the autoscaler may give instances (default all)")
MAX_BODY_BYTES: Var[int | None] = Var("FAAS_GPU_MAX_BODY_BYTES", None, int, "largest /function/ body")
HARMONY_COEFFICIENTS: Var[Path | None] = Var("FAAS_GPU_HARMONY_COEFFICIENTS", None, Path, "HarmonyBatch's model.json")
INFLESS_PROFILES: Var[Path | None] = Var("FAAS_GPU_INFLESS_PROFILES", None, Path, "INFless profile files' folder")
INFLESS_DATA: Var[Path | None] = Var("FAAS_GPU_INFLESS_DATA", None, Path, "INFless data folder (simulator)")
SPOT_PRICES: Var[Path | None] = Var("FAAS_GPU_SPOT_PRICES", None, Path, "spot price CSV (procurer)")
METRICS_PORT: Var[int] = Var(
    "FAAS_GPU_METRICS_PORT", 8082, int, "the gateway's metrics port (/metrics, /healthz; CE's :8082); 0: none"
)

CALLBACK_ALLOW: Var[tuple[str, ...]] = Var(
    "FAAS_GPU_CALLBACK_ALLOW",
    (),
    lambda raw: tuple(item.strip() for item in raw.split(",") if item.strip()),
    "host names, IP addresses and CIDRs (comma-separated) that async callbacks (X-Callback-Url) may reach "
    "although they are loopback, private, link-local or the stack's own (`provider.callbacks`); default none",
)
CALLBACK_TIMEOUT: Var[float] = Var(
    "FAAS_GPU_CALLBACK_TIMEOUT",
    10.0,
    lambda raw: parse_duration(raw, "FAAS_GPU_CALLBACK_TIMEOUT"),
    "how long one callback delivery may take in all (connect: at most 3 s of it, then the request and the "
    "answer's status line); a target that answers later is a failed callback, never retried",
)


def time_scale(raw: str) -> float:
    value = float(raw)
    if not 1.0 <= value <= 3600.0:
        raise ValueError(f"must be between 1 and 3600, got {raw!r}")
    return value


KEEPALIVE_TIME_SCALE: Var[float] = Var(
    "FAAS_GPU_KEEPALIVE_TIME_SCALE",
    1.0,
    time_scale,
    "the keep-alive policies' clock (INFless scaling's invocation minutes, LSTH / HHP windows) runs this many "
    "times faster than the wall's: a trace replayed F times compressed (`faas-gpu replay --keepalive`) keeps its "
    "minutes; 1 (the default): real time. For replays and tests, never a production setting",
)

RUNTIMES = ("local", "docker", "swarm")


def runtime_name(raw: str) -> str:
    value = raw.strip().lower()
    if value not in RUNTIMES:
        raise ValueError(f"expected one of {', '.join(RUNTIMES)}, got {raw!r}")
    return value


RUNTIME: Var[str] = Var(
    "FAAS_GPU_RUNTIME",
    "local",
    runtime_name,
    "what runs the provider's replicas: local (watchdog processes beside the stack), docker "
    "(containers of the functions' images on a Docker Engine, host network) or swarm (one Swarm "
    "service per instance through a manager's engine, host network of the node it lands on)",
)
DOCKER_HOST: Var[str | None] = Var(
    "FAAS_GPU_DOCKER_HOST",
    None,
    _text,
    "the Docker Engine of the docker runtime and of `faas-gpu build --docker` (unix:///..., tcp://...); "
    "default: DOCKER_HOST, else the engine's default socket",
)

ISOLATIONS = ("auto", "on", "off")


def isolation_name(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ISOLATIONS:
        raise ValueError(f"expected one of {', '.join(ISOLATIONS)}, got {raw!r}")
    return value


ISOLATION: Var[str] = Var(
    "FAAS_GPU_ISOLATION",
    "auto",
    isolation_name,
    "the local runtime's sandbox of each replica (`faas_gpu.sandbox.replica`: its own uid, mount, PID and "
    "IPC namespaces, a read-only tree, no capabilities, a seccomp filter, a clean environment): auto, where "
    "the kernel allows it (else replicas run unisolated and the stack says so); on, or the stack does not "
    "start; off, never (replicas then share the stack's user and view of the host)",
)

FORK_SERVER: Var[bool] = Var(
    "FAAS_GPU_FORK_SERVER",
    "on",
    on_off,
    "the local runtime forks isolated python3-gpu replicas from a per-node process that has imported torch and "
    "the template (`faas_gpu.sandbox.zygote`: memory shared, a start in milliseconds); off: every replica is "
    "exec'd and imports them itself",
)

PIN_CPUS: Var[str | None] = Var(
    "FAAS_GPU_PIN_CPUS",
    None,
    _text,
    "a CPU list (0-3,6): the gateway and the local runtime's replicas are each kept on CPUs of it, the "
    "fewest-held first (`provider.runtime.pins`); default: not pinned",
)

METRICS: Var[bool] = Var(
    "FAAS_GPU_METRICS",
    True,
    on_off,
    "on|off: the gateway's per-call records (OpenFaaS's gateway_function_invocation*, "
    "gateway_functions_seconds, and the status page's rate and SLO tally). OpenFaaS's gateway always "
    "counts; off exists to measure what counting costs and for operators who scrape nothing. /metrics "
    "still answers (gateway_service_count), without the per-call series",
)

# -- the scheduler ------------------------------------------------------------------------------
PLACEMENT_POLICIES = ("lb", "lalb", "lalb_o3")
"""The GPU-FaaS paper's placement policies (§IV), as `faas_gpu.policies.make_scheduler` names them:
the baseline, locality-aware load balancing, and LALB with out-of-order dispatch."""


def placement_name(raw: str) -> str:
    value = raw.strip().lower().replace("-", "_")
    if value not in PLACEMENT_POLICIES:
        raise ValueError(f"expected one of {', '.join(PLACEMENT_POLICIES)}, got {raw!r}")
    return value


def skip_limit(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


PLACEMENT: Var[str] = Var(
    "FAAS_GPU_PLACEMENT",
    "lalb_o3",
    placement_name,
    "the scheduler's placement policy: lb, lalb or lalb_o3 (`python -m scheduler --policy`, `faas-gpu up --policy`)",
)
O3_LIMIT: Var[int] = Var(
    "FAAS_GPU_O3_LIMIT",
    25,
    skip_limit,
    "lalb_o3's skip limit: how often a queued job may be overtaken (`--o3-limit`; 0 is plain LALB)",
)

# -- an instance: set by the provider's runtime, read by the template and the GPU client --------
SCHEDULER_URL: Var[tuple[str, ...]] = Var(
    "FAAS_GPU_SCHEDULER_URL", (), _urls, "the schedulers, comma-separated; none: models run in the instance"
)
TOKEN_FILE: Var[Path | None] = Var(
    "FAAS_GPU_TOKEN_FILE",
    None,
    Path,
    "the file holding the function's own token for the scheduler and the GPU Managers: a file in the "
    "replica's sandbox (/var/openfaas/faas-gpu/token), never an environment variable, which anyone the "
    "function shows its environment to would read",
)
TOKEN: Var[str] = Var(
    "FAAS_GPU_TOKEN",
    "",
    str,
    "the function's token itself: read only where FAAS_GPU_TOKEN_FILE is not set (an instance started "
    "by something other than faas-gpu's runtimes, a benchmark); no runtime of ours sets it",
)
FUNCTION: Var[str | None] = Var("FAAS_GPU_FUNCTION", None, _text, "the function's name")
NAMESPACE: Var[str | None] = Var("FAAS_GPU_NAMESPACE", None, _text, "the function's namespace")
MAX_BATCH: Var[int] = Var(
    "FAAS_GPU_MAX_BATCH",
    8,
    int,
    "rows an instance coalesces into one batch. Unset: 8 on the GPU path (a batch amortises the "
    "round trip to the scheduler and a unit's launch); on the instance's CPU path an unset batch "
    "size means no batch queue at all (`LocalBatching`), as a queue there only adds waiting. "
    "The provider's autoscalers always set it.",
)
BATCH_TIMEOUT_MS: Var[float | None] = Var(
    "FAAS_GPU_BATCH_TIMEOUT_MS", None, float, "longest a call waits for its batch to fill (default: SLO / 4, else 5 ms)"
)
APP_TIMEOUTS_MS: Var[dict[str, float]] = Var(
    "FAAS_GPU_APP_TIMEOUTS_MS", {}, app_timeouts_ms, "HarmonyBatch: each app's batch timeout, app=ms,app=ms"
)
SLO_MS: Var[float] = Var("FAAS_GPU_SLO_MS", 0.0, float, "the function's SLO in ms (0: none)")
CLASS: Var[str | None] = Var("FAAS_GPU_CLASS", None, _text, "the function's default request class")
GPU_SHARE: Var[int] = Var("FAAS_GPU_GPU_SHARE", 0, int, "INFless: the instance's GPU SM share in % (0: none)")
GPU_MEMORY_GB: Var[float | None] = Var("FAAS_GPU_GPU_MEMORY_GB", None, float, "HarmonyBatch: the group's GPU memory")
CPU_THREADS: Var[int | None] = Var("FAAS_GPU_CPU_THREADS", None, int, "torch threads the autoscaler gave the instance")
MAX_INFLIGHT: Var[int] = Var("FAAS_GPU_MAX_INFLIGHT", 32, int, "batches one instance sends the scheduler at once")
BATCH_BOUND: Var[bool] = Var(
    "FAAS_GPU_BATCH_BOUND",
    True,
    on_off,
    "on: an instance with an SLO on the GPU path batches the calls that queue behind its batches, up to the largest "
    "batch whose measured time fits half the SLO (`faas_gpu.batching.BatchBound`); off: only its planned batch size, "
    "as before issue 46 (for measuring what the bound buys)",
)
LEASES: Var[bool] = Var(
    "FAAS_GPU_LEASES", True, on_off, "on: ask the scheduler for placement leases and send batches to the GPU Manager"
)
MODEL: Var[str | None] = Var("FAAS_GPU_MODEL", None, _text, "the model's name (com.faas-gpu.model)")
PROTEAN_MODEL: Var[str | None] = Var(
    "FAAS_GPU_PROTEAN_MODEL", None, _text, "the model's name in PROTEAN's assumptions, when it differs"
)

EXEC_TIMEOUT: Var[float] = Var(
    "exec_timeout",
    30.0,
    lambda raw: parse_duration(raw, "exec_timeout"),
    "the watchdog's own (of-watchdog's) timeout of a call, its inproc default: the GPU client stops "
    "waiting for a strict batch's answer just before it, since the watchdog answers 504 then and "
    "nobody reads a later answer (0: none)",
)

DEFAULT_BATCH_TIMEOUT_S = 0.005
"""A batch's timeout when neither FAAS_GPU_BATCH_TIMEOUT_MS nor an SLO is set."""
INSTANCE_MIN_THREADS = 8


def batch_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """FAAS_GPU_BATCH_TIMEOUT_MS, else a quarter of the SLO, else 5 ms."""
    timeout_ms = BATCH_TIMEOUT_MS.read(env)
    if timeout_ms is not None:
        return timeout_ms / 1000
    slo_ms = SLO_MS.read(env)
    return slo_ms / 4000 if slo_ms else DEFAULT_BATCH_TIMEOUT_S


def instance_threads(env: Mapping[str, str] | None = None) -> int:
    """A python3-gpu instance's request threads: a batch of B needs B requests in flight at once,
    2B lets the next one form while one runs; at least 8 (which an unset batch size's 8 rows fill)."""
    batch = MAX_BATCH.read(env) if MAX_BATCH.is_set(env) else 1
    return max(INSTANCE_MIN_THREADS, 2 * batch)
