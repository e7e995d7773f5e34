"""Serve the gateway (8080) and provider API (8081) from one gunicorn gthread worker.

One worker, many threads: the replicas, the embedded datastore and the dispatcher's view of
the replicas live in that worker's memory, as they do in faasd's single provider process.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from gunicorn.app.base import BaseApplication

from .config import ProviderConfig

log = logging.getLogger("faas-gpu")


class StackServer(BaseApplication):
    def __init__(self, config: ProviderConfig):
        self.config_ = config
        self.stack = None
        super().__init__()

    def load_config(self) -> None:
        c = self.config_
        settings = {
            "bind": [f"{c.bind}:{c.gateway_port}", f"{c.bind}:{c.provider_port}"],
            "workers": 1,
            "worker_class": "gthread",
            "threads": c.threads,
            "keepalive": 75,
            "timeout": 120,
            "graceful_timeout": 40,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": "faas-gpu",
            "worker_exit": self._worker_exit,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        from .app import Stack, build_provider

        self.stack = Stack(build_provider(self.config_))
        self.stack.start()
        log.info(
            "faas-gpu serving: gateway http://%s:%d, provider http://%s:%d, state %s",
            self.config_.bind,
            self.config_.gateway_port,
            self.config_.bind,
            self.config_.provider_port,
            self.config_.home,
        )
        return self.stack

    def _worker_exit(self, _server, _worker) -> None:
        if self.stack is not None:
            self.stack.close()


def parse_args(argv: list[str] | None) -> ProviderConfig:
    p = argparse.ArgumentParser(prog="faas-gpu serve", description=__doc__)
    p.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--gateway-port", type=int, default=8080)
    p.add_argument("--provider-port", type=int, default=8081)
    p.add_argument("--home", type=Path, help="state folder (default $FAAS_GPU_HOME or ./.faas-gpu)")
    p.add_argument("--etcd", help="etcd URL, e.g. http://127.0.0.1:2379 (default: embedded store)")
    p.add_argument("--redis", help="Redis URL for the async queue (default: embedded queue)")
    p.add_argument("--scheduler", help="GPU scheduler URL(s) for the functions' GPU client (comma-separated)")
    p.add_argument("--namespace", action="append", help="allowed namespace (repeatable)")
    p.add_argument("--max-body-bytes", type=int, help="largest /function/ request body")
    p.add_argument("--threads", type=int, default=32)
    a = p.parse_args(argv)
    overrides = {
        "bind": a.bind,
        "gateway_port": a.gateway_port,
        "provider_port": a.provider_port,
        "etcd_url": a.etcd,
        "redis_url": a.redis,
        "scheduler_url": a.scheduler,
        "threads": a.threads,
    }
    if a.home:
        overrides["home"] = a.home.resolve()
    if a.namespace:
        overrides["namespaces"] = tuple(a.namespace)
    cfg = ProviderConfig.from_env(**overrides)
    if a.max_body_bytes:
        cfg.max_body_bytes = a.max_body_bytes
    return cfg


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    StackServer(cfg).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
