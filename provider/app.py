"""Wiring: build the Provider from a config, and the WSGI apps of its ports (gateway, provider, metrics)."""

from __future__ import annotations

import logging
import os
import socket

from flask import Flask, Response

from faas_gpu import paths
from faas_gpu.async_queue import open_queue
from faas_gpu.contract import env as contract_env
from faas_gpu.contract.http_status import status_line
from faas_gpu.credentials import REDIS_CREDENTIALS_FILE, ensure_token, resolve_login
from faas_gpu.datastore import open_datastore
from faas_gpu.fn_credentials import FunctionCredentials
from faas_gpu.history import open_history
from faas_gpu.imagestore import ImageStore
from faas_gpu.profiling.predictor import LatencyPredictor
from faas_gpu.profiling.store import ProfileStore
from faas_gpu.schedulers import Directory

from .auth import ensure_credentials
from .callbacks import CONNECT_TIMEOUT_S, TIMEOUT_S, CallbackDispatcher, stack_policy
from .config import ProviderConfig
from .core import Provider
from .gateway import AsyncWorker, InvocationApp
from .invoke import Invoker
from .logs import LogStore
from .metrics import GatewayMetrics, ProviderMetrics
from .runtime import Runtime
from .runtime.local import LocalRuntime
from .runtime.pins import CpuPins, pin_tree
from .scaling import (
    HarmonyPools,
    InflessScaling,
    InvocationRateRule,
    ProteanFunctions,
    ScalingRouter,
    scaled_wall,
)
from .store import FunctionStore, SecretStore
from .system import system_blueprint
from .ui import ui_blueprint
from .ui.status import StatusCollector

log = logging.getLogger(__name__)


def build_provider(config: ProviderConfig) -> Provider:
    home = paths.ensure_private_home(config.home)
    credentials = ensure_credentials(config.secrets_dir)
    datastore = open_datastore(
        config.etcd_url,
        paths.state_db(home),
        cluster_token=ensure_token(config.secrets_dir),  # records sealed and checked (`faas_gpu.datastore.sealed`)
        credentials_file=config.etcd_credentials,
        secrets_dir=config.secrets_dir,
        timeout_s=config.datastore_timeout_s,
        retry_s=config.datastore_retry_s,
    )
    redis_url, redis_login = (None, None)
    if config.redis_url:
        redis_url, redis_login = resolve_login(
            config.redis_url, config.redis_credentials, config.secrets_dir, REDIS_CREDENTIALS_FILE
        )
    store = FunctionStore(datastore)
    secrets = SecretStore(home / "function-secrets")
    logs = LogStore(home / "logs")
    gpu_env, fn_credentials = {}, None
    if config.scheduler_url:
        # replicas get their function's own token (faas_gpu.fn_credentials), never the cluster's
        gpu_env = {contract_env.SCHEDULER_URL.name: config.scheduler_url}
        fn_credentials = FunctionCredentials(datastore, config.secrets_dir / "function-tokens")
    schedulers = Directory(datastore).start() if config.scheduler_url else None  # + those announced
    runtime: Runtime
    if config.runtime == "docker":
        from .runtime.docker import DockerRuntime  # the docker SDK only where it is used

        runtime = DockerRuntime(
            home, secrets, logs, gpu_env, schedulers, fn_credentials, docker_host=config.docker_host
        )
    elif config.runtime == "swarm":
        import docker

        from .runtime.swarm import SwarmRuntime

        client = docker.DockerClient(base_url=config.docker_host) if config.docker_host else docker.from_env()
        runtime = SwarmRuntime(client, secrets, logs, gpu_env, schedulers, fn_credentials, network=config.swarm_network)
    else:
        pins = CpuPins(config.pin_cpus) if config.pin_cpus else None
        if pins is not None:
            pin_tree(os.getpid(), pins.take())  # the gateway is the process building the provider
        runtime = LocalRuntime(
            home,
            ImageStore(home / "images"),
            secrets,
            logs,
            gpu_env,
            schedulers,
            fn_credentials,
            pins=pins,
            isolation=config.isolation or "auto",
        )
    invoker = Invoker(
        store,
        runtime,
        config.namespaces,
        upstream_timeout_s=config.upstream_timeout_s,
        ready_timeout_s=config.ready_timeout_s,
        threads=config.threads,
        max_inflight_per_function=config.max_inflight_per_function,
    )
    queue = open_queue(redis_url, home / "queue.db", redis_login)
    # the node's own end-to-end measurements first, where it has them (`LatencyPredictor`'s docstring)
    predictor = LatencyPredictor(
        ProfileStore(home / "profiles.db"), infless_dir=config.infless_profiles, prefer_measured=True
    )
    policies = [
        InflessScaling(
            datastore,
            open_history(redis_url, home / "history.db", redis_login),
            predictor,
            cpus=config.cpus,
            gpus=config.gpus,
            node=socket.gethostname(),
            wall=scaled_wall(config.keepalive_time_scale),
            time_scale=config.keepalive_time_scale,
        ),
        HarmonyPools(
            config.harmony_coefficients or home / "harmony-models.json",
            gpu_path=bool(config.scheduler_url),
            plan_period_s=config.harmony_plan_period_s,
        ),
        ProteanFunctions(surplus_window_s=config.protean_surplus_window_s),
    ]
    autoscaler = ScalingRouter(
        runtime,
        policies,
        set_replicas=store.set_replicas,
        period_s=config.autoscale_period_s,
        alert_rule=InvocationRateRule() if config.alert_rule else None,
    )
    invoker.dispatcher = autoscaler
    return Provider(
        config, credentials, datastore, store, secrets, logs, runtime, invoker, queue, autoscaler, fn_credentials
    )


def _flask(provider: Provider, *, gateway: bool) -> Flask:
    app = Flask("faas-gpu-gateway" if gateway else "faas-gpu-provider")
    app.config["MAX_CONTENT_LENGTH"] = provider.config.max_system_body_bytes
    app.config["FAAS_GPU_STATE_FOLDER"] = str(provider.config.home)  # named by a full disk's 507
    app.register_blueprint(system_blueprint(provider, gateway=gateway))
    if gateway:  # the status page, where OpenFaaS's gateway serves its portal
        status = StatusCollector(provider)
        app.register_blueprint(ui_blueprint(status, auth=provider.config.basic_auth, check=provider.credentials.check))
    app.after_request(_go_status_line)
    return app


def _go_status_line(response):
    """Reason phrases as Go's net/http writes them ("202 Accepted", `http_status`): werkzeug
    upper-cases them ("202 ACCEPTED") and names some codes otherwise, and faas-cli prints the
    status line it gets verbatim."""
    response.status = status_line(response.status_code)
    return response


def _metrics_app(metrics: GatewayMetrics) -> Flask:
    """The CE gateway's second server (gateway/main.go `runMetricsServer`, :8082): `/metrics`
    and `/healthz` only, no auth, so Prometheus set-ups written for OpenFaaS find them."""
    app = Flask("faas-gpu-gateway-metrics")
    app.add_url_rule("/metrics", "metrics", metrics.exposition)
    app.add_url_rule("/healthz", "healthz", lambda: Response("OK", mimetype="text/plain"), methods=["GET"])
    app.after_request(_go_status_line)
    return app


def callback_dispatcher(config: ProviderConfig) -> CallbackDispatcher:
    """Async callbacks' delivery: closed to the stack's own addresses (where it listens, its etcd,
    Redis and schedulers) and to non-public ones, but for what the operator allows."""
    policy = stack_policy(
        config.callback_allow or (),
        binds=[config.bind],
        etcd_url=config.etcd_url,
        redis_url=config.redis_url,
        scheduler_url=config.scheduler_url,
    )
    timeout_s = config.callback_timeout_s or TIMEOUT_S
    return CallbackDispatcher(policy, connect_timeout_s=min(CONNECT_TIMEOUT_S, timeout_s), timeout_s=timeout_s)


class Stack:
    """All ports' apps over one Provider, plus the async worker (the queue-worker's role)."""

    def __init__(self, provider: Provider):
        self.provider = provider

        def replicas() -> dict[str, int]:
            return {f"{r.name}.{r.namespace}": r.replicas for r in provider.store.list()}

        self.gateway_metrics = GatewayMetrics(replicas)
        self.provider_metrics = ProviderMetrics()

        gw = _flask(provider, gateway=True)
        gw.add_url_rule("/metrics", "metrics", self.gateway_metrics.exposition)
        pv = _flask(provider, gateway=False)
        self.provider_metrics.instrument(pv)
        pv.add_url_rule("/metrics", "metrics", self.provider_metrics.exposition)

        self.metrics_app = _metrics_app(self.gateway_metrics).wsgi_app
        self.gateway_app = InvocationApp(provider, self.gateway_metrics, gw.wsgi_app, gateway=True)
        self.provider_app = InvocationApp(provider, self.gateway_metrics, pv.wsgi_app, gateway=False)
        self.worker = AsyncWorker(
            self.gateway_app,
            provider.config.async_workers,
            consumer=f"{socket.gethostname()}-{os.getpid()}",
            callbacks=callback_dispatcher(provider.config),
        )

    def start(self) -> None:
        restored = self.provider.restore()
        if restored:
            log.info("restored %d functions from the datastore", restored)
        if self.provider.autoscaler is not None:
            self.provider.autoscaler.start()
        self.worker.start()

    def close(self) -> None:
        self.worker.stop()
        self.provider.close()

    def __call__(self, environ: dict, start_response):
        """Route by the local port the request arrived on (not the spoofable Host header)."""
        sock = environ.get("gunicorn.socket")
        port = sock.getsockname()[1] if sock is not None else int(environ.get("SERVER_PORT", 0))
        if port == self.provider.config.provider_port:
            return self.provider_app(environ, start_response)
        if port and port == self.provider.config.metrics_port:
            return self.metrics_app(environ, start_response)
        return self.gateway_app(environ, start_response)
