"""of-watchdog's Prometheus metrics (http_requests, http_request_duration_seconds,
http_requests_in_flight), served on `metrics_port` (127.0.0.1) when it is not 0."""

from __future__ import annotations


class Metrics:
    def __init__(self, port: int):
        self.enabled = port > 0
        if not self.enabled:
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.registry = CollectorRegistry()
        self.total = Counter(
            "http_requests", "total HTTP requests processed", ["code", "method"], registry=self.registry
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Seconds spent serving HTTP requests.",
            ["code", "method"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "http_requests_in_flight", "current number of requests being served", registry=self.registry
        )
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def observe(self, code: int, method: str, seconds: float) -> None:
        if self.enabled:
            self.total.labels(str(code), method.lower()).inc()
            self.duration.labels(str(code), method.lower()).observe(seconds)
