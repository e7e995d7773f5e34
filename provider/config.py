"""Provider settings: one dataclass with typed defaults, read from flags or the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from faas_gpu import paths
from faas_gpu.contract import env as env_vars
from faas_gpu.contract.duration import parse_duration

from .callbacks import parse_allow
from .runtime.pins import parse_cpu_list

__all__ = ["DEFAULT_NAMESPACE", "ProviderConfig", "parse_duration"]  # parse_duration: the contract's, for callers here

DEFAULT_NAMESPACE = "openfaas-fn"


@dataclass
class ProviderConfig:
    bind: str = "127.0.0.1"
    gateway_port: int = 8080
    provider_port: int = 8081
    metrics_port: int | None = None
    """The gateway's metrics on a port of their own (`/metrics`, `/healthz`), as the CE gateway
    serves them on :8082; None: $FAAS_GPU_METRICS_PORT, else 8082; 0: not served apart (the
    gateway and provider ports keep their own /metrics)."""
    metrics: bool = True
    """The gateway's per-call records: OpenFaaS's invocation counters and duration histogram, and
    the status page's rate and SLO tally (`provider.activity`). OpenFaaS's gateway always counts;
    off (`--no-metrics`, FAAS_GPU_METRICS=off) is for measuring their cost and for operators who
    scrape nothing. /metrics still answers then, with gateway_service_count and no per-call series."""
    home: Path = field(default_factory=paths.home)
    etcd_url: str | None = None
    redis_url: str | None = None
    etcd_credentials: Path | None = None
    """The daemons' etcd login file (user:password); None: secrets/etcd-credentials when it exists,
    else the URL's userinfo (`faas_gpu.credentials.resolve_login`)."""
    redis_credentials: Path | None = None
    """The daemons' Redis login file; None: secrets/redis-credentials when it exists, else the URL's."""
    scheduler_url: str | None = None
    """The GPU scheduler the functions' GPU clients call (comma-separated replicas); None: models run locally."""
    basic_auth: bool = True
    namespaces: tuple[str, ...] = (DEFAULT_NAMESPACE,)
    max_body_bytes: int = 20 * 1024 * 1024
    """Largest /function/ request body; larger gets 413 (the OpenFaaS gateway has no limit of its own)."""
    async_max_body_bytes: int = 256_000
    """OpenFaaS CE's queue limit for /async-function/ bodies."""
    max_system_body_bytes: int = 4 * 1024 * 1024
    upstream_timeout_s: float = 60.0
    ready_timeout_s: float = 60.0
    """How long an invocation waits for a starting replica (scale from zero)."""
    datastore_timeout_s: float = 1.0
    datastore_retry_s: float = 1.0
    """etcd bounds on the request path: a control-plane call answers 503 within about this long when
    etcd is away (then at once until it returns), and an invocation falls back to cached records."""
    async_workers: int = 4
    callback_allow: tuple[str, ...] | None = None
    """Host names, IPs and CIDRs async callbacks may reach although loopback, private or the
    stack's own (`provider.callbacks`); None: $FAAS_GPU_CALLBACK_ALLOW, else none."""
    callback_timeout_s: float | None = None
    """One callback delivery's whole time (connect at most 3 s of it); None: $FAAS_GPU_CALLBACK_TIMEOUT, else 10 s."""
    threads: int = 64
    """Gateway request threads (one gthread worker). Invocations hold at most all but an eighth of
    them, one function at most `max_inflight_per_function`, unless its `max_inflight` allows fewer
    (`provider.inflight`)."""
    max_inflight_per_function: int | None = None
    """One function's in-flight invocations at the gateway; None: half the threads, so one slow
    function never holds every thread (a single-function load test raises it)."""
    cpus: float = field(default_factory=lambda: float(os.cpu_count() or 1))
    """CPU cores the autoscaler may give to instances of managed functions on this node."""
    gpus: int = 0
    """GPUs whose SM shares the autoscaler may give (0: CPU configurations only)."""
    autoscale_period_s: float = 1.0
    alert_rule: bool = True
    """Plain functions autoscale by OpenFaaS CE's APIHighInvocationRate alert, evaluated here
    (`scaling.replicas`); off when an external Prometheus + AlertManager posts /system/alert."""
    harmony_coefficients: Path | None = None
    """HarmonyBatch latency/cost coefficients (model.json format); default <home>/harmony-models.json."""
    harmony_plan_period_s: float = 10.0
    protean_surplus_window_s: float = 600.0
    """PROTEAN's delayed termination: how long containers must stay surplus before they stop."""
    infless_profiles: Path | None = None
    """A folder of INFless profile files (<model>-profile-results.txt), the predictor's last fallback."""
    runtime: str | None = None
    """What runs replicas: "local" (processes), "docker" (containers on one engine) or "swarm" (Swarm
    services through a manager's engine); None: $FAAS_GPU_RUNTIME, else local."""
    docker_host: str | None = None
    """The docker runtime's engine; None: $FAAS_GPU_DOCKER_HOST, else DOCKER_HOST or the default socket."""
    pin_cpus: tuple[int, ...] = ()
    """CPUs the gateway and the local runtime's replicas are kept on, each process on the fewest-held
    (`runtime.pins` says why); (): not pinned. From `--pin-cpus` or $FAAS_GPU_PIN_CPUS."""
    isolation: str | None = None
    """The local runtime's sandbox of replicas: auto, on or off; None: $FAAS_GPU_ISOLATION, else auto
    (`runtime.isolation`)."""
    swarm_network: str | None = None
    """The swarm runtime's network for functions' services: None, the node's host network (replicas at
    <node address>:<their own port>); else an attachable overlay the gateway is on too (replicas at
    their task's address on it), as deploy/swarm-stack.yml runs it."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides) -> ProviderConfig:
        env = dict(os.environ if env is None else env)
        cfg = cls(**overrides)
        if "FAAS_GPU_ETCD" in env and cfg.etcd_url is None:
            cfg.etcd_url = env["FAAS_GPU_ETCD"]
        if "FAAS_GPU_REDIS" in env and cfg.redis_url is None:
            cfg.redis_url = env["FAAS_GPU_REDIS"]
        if cfg.etcd_credentials is None:
            cfg.etcd_credentials = env_vars.ETCD_CREDENTIALS.read(env)
        if cfg.redis_credentials is None:
            cfg.redis_credentials = env_vars.REDIS_CREDENTIALS.read(env)
        if "FAAS_GPU_CPUS" in env:
            cfg.cpus = float(env["FAAS_GPU_CPUS"])
        if "FAAS_GPU_HARMONY_COEFFICIENTS" in env and cfg.harmony_coefficients is None:
            cfg.harmony_coefficients = Path(env["FAAS_GPU_HARMONY_COEFFICIENTS"])
        if "FAAS_GPU_INFLESS_PROFILES" in env and cfg.infless_profiles is None:
            cfg.infless_profiles = Path(env["FAAS_GPU_INFLESS_PROFILES"])
        if "FAAS_GPU_MAX_BODY_BYTES" in env:
            cfg.max_body_bytes = int(env["FAAS_GPU_MAX_BODY_BYTES"])
        if "metrics" not in overrides:
            cfg.metrics = env_vars.METRICS.read(env)
        if cfg.metrics_port is None:
            cfg.metrics_port = env_vars.METRICS_PORT.read(env)
        if cfg.runtime is None:
            cfg.runtime = env_vars.RUNTIME.read(env)
        else:
            cfg.runtime = env_vars.runtime_name(cfg.runtime)
        if cfg.docker_host is None:
            cfg.docker_host = env_vars.DOCKER_HOST.read(env)
        if cfg.isolation is None:
            cfg.isolation = env_vars.ISOLATION.read(env)
        else:
            cfg.isolation = env_vars.isolation_name(cfg.isolation)
        if not cfg.pin_cpus and env_vars.PIN_CPUS.is_set(env):
            cfg.pin_cpus = parse_cpu_list(env_vars.PIN_CPUS.raw(env) or "", env_vars.PIN_CPUS.name)
        if cfg.pin_cpus and cfg.runtime != "local":
            raise ValueError(
                f"--pin-cpus ({env_vars.PIN_CPUS.name}): only the local runtime pins replicas, not {cfg.runtime} "
                "(give containers a cpuset there)"
            )
        if cfg.callback_allow is None:
            cfg.callback_allow = env_vars.CALLBACK_ALLOW.read(env)
        if cfg.callback_timeout_s is None:
            cfg.callback_timeout_s = env_vars.CALLBACK_TIMEOUT.read(env)
        if cfg.callback_timeout_s <= 0:
            raise ValueError(f"--callback-timeout ({env_vars.CALLBACK_TIMEOUT.name}): must be more than 0")
        # checked at start, not at the first callback
        parse_allow(cfg.callback_allow, f"--callback-allow ({env_vars.CALLBACK_ALLOW.name})")
        if "upstream_timeout" in env:
            cfg.upstream_timeout_s = parse_duration(env["upstream_timeout"], "upstream_timeout")
        return cfg

    @property
    def secrets_dir(self) -> Path:
        return self.home / "secrets"
