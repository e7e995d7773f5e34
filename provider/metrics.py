"""Prometheus metrics with OpenFaaS's names: the gateway's and faas-provider's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric


class _StartedCollector:
    """`gateway_function_invocation_started`, named exactly as OpenFaaS names it.

    The Go client exposes this counter without a `_total` suffix; prometheus_client would add
    one to any counter, so it is exposed untyped under its exact name.
    """

    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics

    def collect(self):
        family = Metric("gateway_function_invocation_started", "Function invocation started", "unknown")
        with self.metrics._started_lock:
            for name, count in sorted(self.metrics._started.items()):
                family.add_sample("gateway_function_invocation_started", {"function_name": name}, float(count))
        yield family


class GatewayMetrics:
    """gateway/metrics/metrics.go: function_name is `fn.<namespace>`."""

    def __init__(self, replicas: Callable[[], dict[str, int]]):
        self.registry = CollectorRegistry()
        self.seconds = Histogram(
            "gateway_functions_seconds",
            "Function time taken",
            ["function_name", "code"],
            registry=self.registry,
        )
        self.total = Counter(
            "gateway_function_invocation",
            "Function metrics",
            ["function_name", "code"],
            registry=self.registry,
        )
        self._started: dict[str, int] = {}
        self._started_lock = threading.Lock()
        self.registry.register(_StartedCollector(self))
        self.service_count = Gauge(
            "gateway_service_count",
            "Current count of replicas for function",
            ["function_name"],
            registry=self.registry,
        )
        self._replicas = replicas
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}  # by (function_name, code)

    def started(self, function_name: str) -> None:
        with self._started_lock:
            self._started[function_name] = self._started.get(function_name, 0) + 1

    def finished(self, function_name: str, code: int, seconds: float) -> None:
        """On every call: the labelled children are looked up once per (function, code) and kept,
        as `labels()` takes a lock and builds its key each time (6 µs a call of the 9 µs recording cost)."""
        children = self._children.get((function_name, code))
        if children is None:
            labels = (function_name, str(code))
            children = self._children[(function_name, code)] = (
                self.total.labels(*labels),
                self.seconds.labels(*labels),
            )
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> Response:
        self.service_count.clear()
        for name, count in self._replicas().items():
            self.service_count.labels(name).set(count)
        return Response(generate_latest(self.registry), mimetype=CONTENT_TYPE_LATEST)


class ProviderMetrics:
    """faas-provider/metrics.go: provider_http_requests_total and its duration histogram."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "provider_http_requests",
            "total HTTP requests processed",
            ["code", "method", "path"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "provider_http_request_duration_seconds",
            "Seconds spent serving HTTP requests.",
            ["code", "method", "path"],
            registry=self.registry,
        )

    def instrument(self, app: Flask) -> None:
        @app.before_request
        def _start():
            g._t0 = time.perf_counter()

        @app.after_request
        def _record(resp: Response):
            path = request.url_rule.rule if request.url_rule else "unmatched"
            labels = (str(resp.status_code), request.method, path)
            self.requests.labels(*labels).inc()
            self.duration.labels(*labels).observe(time.perf_counter() - getattr(g, "_t0", time.perf_counter()))
            return resp

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), mimetype=CONTENT_TYPE_LATEST)
