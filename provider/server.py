"""Serve the gateway (8080), provider API (8081) and gateway metrics (8082) from one gunicorn gthread worker.

One worker, many threads: the replicas, the embedded datastore and the dispatcher's view of
the replicas live in that worker's memory, as they do in faasd's single provider process.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from faas_gpu import paths, tracing
from faas_gpu.contract.env import RUNTIMES
from faas_gpu.serving import OneWorkerServer

from .config import ProviderConfig, parse_duration
from .runtime.pins import parse_cpu_list

log = logging.getLogger("faas-gpu")


class _Daemon:
    """Built inside the gunicorn worker: the provider, its runtime and both ports' apps."""

    def __init__(self, config: ProviderConfig):
        self.config = config
        self.stack = None

    def load(self):
        tracing.configure("faas-gpu-gateway")  # in the worker: the SDK's export thread does not survive a fork
        from .app import Stack, build_provider

        c = self.config
        self.stack = Stack(build_provider(c))
        self.stack.start()
        log.info(
            "faas-gpu serving: gateway http://%s:%d, provider http://%s:%d, metrics %s%s, state %s",
            c.bind,
            c.gateway_port,
            c.bind,
            c.provider_port,
            f"http://{c.bind}:{c.metrics_port}/metrics" if c.metrics_port else "not served apart",
            "" if c.metrics else " (per-call records off)",
            c.home,
        )
        return self.stack

    def close(self) -> None:
        if self.stack is not None:
            self.stack.close()


def add_callback_flags(p: argparse.ArgumentParser) -> None:
    """`--callback-allow` and `--callback-timeout`, the same on `serve` and `up` (which passes them on)."""
    p.add_argument(
        "--callback-allow",
        action="append",
        metavar="HOSTS",
        help="host names, IPs or CIDRs (repeatable, or a comma list) async callbacks (X-Callback-Url) may reach "
        "although loopback, private, link-local or the stack's own: e.g. 127.0.0.1 for a receiver on this host; "
        "never the stack's etcd, Redis or scheduler ports (default $FAAS_GPU_CALLBACK_ALLOW, else none)",
    )
    p.add_argument(
        "--callback-timeout",
        metavar="DURATION",
        help="one callback delivery's whole time, connect (at most 3 s) to the answer's status line; a later "
        "answer is a failed callback, not retried (default $FAAS_GPU_CALLBACK_TIMEOUT, else 10s)",
    )


def parse_args(argv: list[str] | None) -> ProviderConfig:
    p = argparse.ArgumentParser(prog="faas-gpu serve", description=__doc__)
    p.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--gateway-port", type=int, default=8080)
    p.add_argument("--provider-port", type=int, default=8081)
    p.add_argument(
        "--metrics-port",
        type=int,
        help="the gateway's /metrics and /healthz on a port of their own, as the OpenFaaS gateway's :8082 "
        "(default $FAAS_GPU_METRICS_PORT, else 8082; 0: off)",
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="the gateway keeps no per-call records (invocation counters, durations, the status page's rate "
        "and SLO tally); OpenFaaS's gateway always counts: this is for measuring their cost and for "
        "operators who scrape nothing (default $FAAS_GPU_METRICS, else on)",
    )
    p.add_argument("--home", type=Path, help="state folder (default $FAAS_GPU_HOME or ./.faas-gpu)")
    p.add_argument("--etcd", help="etcd URL, e.g. http://127.0.0.1:2379 (default: embedded store)")
    p.add_argument("--redis", help="Redis URL for the async queue (default: embedded queue)")
    p.add_argument(
        "--etcd-credentials",
        type=Path,
        help="file with the etcd login, user:password (default $FAAS_GPU_ETCD_CREDENTIALS, else "
        "secrets/etcd-credentials in the state folder when it exists, else the URL's user:password@)",
    )
    p.add_argument(
        "--redis-credentials",
        type=Path,
        help="file with the Redis login, user:password (default $FAAS_GPU_REDIS_CREDENTIALS, else "
        "secrets/redis-credentials in the state folder when it exists, else the URL's user:password@)",
    )
    p.add_argument("--scheduler", help="GPU scheduler URL(s) for the functions' GPU client (comma-separated)")
    p.add_argument("--namespace", action="append", help="allowed namespace (repeatable)")
    add_callback_flags(p)
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        help="what runs replicas: local processes, docker containers, or swarm services through a manager's "
        "engine (default $FAAS_GPU_RUNTIME, else local)",
    )
    p.add_argument("--docker-host", help="the docker runtime's engine (default $FAAS_GPU_DOCKER_HOST, DOCKER_HOST)")
    p.add_argument(
        "--swarm-network",
        help="swarm runtime: an attachable overlay network the functions' services join (the gateway must be on "
        "it too); default: each node's host network",
    )
    p.add_argument("--max-body-bytes", type=int, help="largest /function/ request body")
    p.add_argument(
        "--threads",
        type=int,
        default=ProviderConfig.threads,
        help=f"request threads (default {ProviderConfig.threads}); an eighth are kept from invocations",
    )
    p.add_argument(
        "--max-inflight-per-function",
        type=int,
        help="in-flight invocations of one function before 429 (default: half the threads)",
    )
    p.add_argument(
        "--pin-cpus",
        metavar="LIST",
        help="keep the gateway and each local replica on CPUs of this list (0-3,6), the fewest-held first: "
        "their Python threads then hand their lock over on one CPU (default $FAAS_GPU_PIN_CPUS, else not pinned)",
    )
    p.add_argument("--cpus", type=float, help="CPU cores for managed functions' instances (default: all)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs whose SM shares managed instances may use")
    p.add_argument("--autoscale-period", type=float, default=1.0, help="seconds between autoscaler decisions")
    p.add_argument(
        "--no-alert-rule",
        action="store_true",
        help="plain functions do not autoscale by the built-in APIHighInvocationRate rule (use it when an "
        "external Prometheus + AlertManager posts /system/alert)",
    )
    p.add_argument("--harmony-coefficients", type=Path, help="HarmonyBatch coefficients (model.json format)")
    p.add_argument("--harmony-plan-period", type=float, default=10.0, help="seconds between HarmonyBatch plans")
    p.add_argument(
        "--protean-surplus-window",
        default="10m",
        help="com.faas-gpu.scaling: protean stops containers only after they stayed surplus this long (default 10m)",
    )
    a = p.parse_args(argv)
    overrides_callbacks: dict[str, object] = {}
    if a.callback_allow is not None:
        overrides_callbacks["callback_allow"] = tuple(a.callback_allow)
    if a.callback_timeout is not None:
        try:
            overrides_callbacks["callback_timeout_s"] = parse_duration(a.callback_timeout, "--callback-timeout")
        except ValueError as exc:
            p.error(str(exc))
    if a.threads < 1:
        p.error(f"--threads: must be at least 1, got {a.threads}")
    if a.max_inflight_per_function is not None and a.max_inflight_per_function < 1:
        p.error(f"--max-inflight-per-function: must be at least 1, got {a.max_inflight_per_function}")
    if a.metrics_port is not None and not 0 <= a.metrics_port <= 65535:
        p.error(f"--metrics-port: must be a port number (0: off), got {a.metrics_port}")
    try:
        surplus_s = parse_duration(a.protean_surplus_window, "--protean-surplus-window")
    except ValueError as exc:
        p.error(str(exc))
    overrides = {
        "bind": a.bind,
        "gateway_port": a.gateway_port,
        "provider_port": a.provider_port,
        "metrics_port": a.metrics_port,
        "alert_rule": not a.no_alert_rule,
        "etcd_url": a.etcd,
        "redis_url": a.redis,
        "etcd_credentials": a.etcd_credentials.resolve() if a.etcd_credentials else None,
        "redis_credentials": a.redis_credentials.resolve() if a.redis_credentials else None,
        "scheduler_url": a.scheduler,
        "runtime": a.runtime,
        "docker_host": a.docker_host,
        "swarm_network": a.swarm_network,
        "threads": a.threads,
        "max_inflight_per_function": a.max_inflight_per_function,
        "gpus": a.gpus,
        "autoscale_period_s": a.autoscale_period,
        "harmony_plan_period_s": a.harmony_plan_period,
        "protean_surplus_window_s": surplus_s,
        **overrides_callbacks,
    }
    if a.no_metrics:
        overrides["metrics"] = False
    if a.harmony_coefficients:
        overrides["harmony_coefficients"] = a.harmony_coefficients.resolve()
    if a.cpus:
        overrides["cpus"] = a.cpus
    if a.home:
        overrides["home"] = a.home.resolve()
    if a.pin_cpus:
        try:
            overrides["pin_cpus"] = parse_cpu_list(a.pin_cpus)
        except ValueError as exc:
            p.error(str(exc))
    if a.namespace:
        overrides["namespaces"] = tuple(a.namespace)
    try:
        cfg = ProviderConfig.from_env(**overrides)
    except ValueError as exc:
        p.error(str(exc))
    if cfg.metrics_port and cfg.metrics_port in (cfg.gateway_port, cfg.provider_port):
        p.error(f"--metrics-port: {cfg.metrics_port} is already the gateway's or the provider's port")
    if a.max_body_bytes:
        cfg.max_body_bytes = a.max_body_bytes
    return cfg


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = parse_args(argv)
    paths.private_umask()  # state, logs and replicas' files: 0700 / 0600, like the secrets
    signal.signal(signal.SIGINT, signal.default_int_handler)
    daemon = _Daemon(cfg)
    binds = [f"{cfg.bind}:{cfg.gateway_port}", f"{cfg.bind}:{cfg.provider_port}"]
    if cfg.metrics_port:
        binds.append(f"{cfg.bind}:{cfg.metrics_port}")
    OneWorkerServer(binds, daemon.load, daemon.close, threads=cfg.threads, timeout_s=120).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
