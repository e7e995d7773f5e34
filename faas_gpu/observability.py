"""The daemons' Prometheus metrics, built from the contract's specs (`faas_gpu.contract.metrics`).

One `DaemonMetrics` per daemon, each with its own `CollectorRegistry` (not the library's global
one), so that tests can run several daemons' metrics in one process and a daemon exports only its
own names. Two ways a value gets there, as the spec says:
- events (a cache hit, a placement, a finished job) increment the instruments made here, with no
  lock beyond prometheus_client's own;
- readings (queue depth, GPU memory, nodes held) are read when scraped: the daemon registers a
  `reader` that returns the current samples, and the family's HELP and labels come from the spec.

Triton's counters have no `_total`; prometheus_client would add one, so they are kept in an
unregistered `Counter` and exposed untyped under their exact name (`Kind.EXACT_COUNTER`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from flask import Flask, Response
from flask import request as flask_request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from faas_gpu.contract.metrics import Daemon, Kind, MetricSpec, for_daemon
from faas_gpu.serving import bearer_token, token_matches, unauthorized

log = logging.getLogger(__name__)

Sample = tuple[Sequence[str], float]
"""One sample of a reading: its label values in the spec's order, and its value."""
Reader = Callable[[], dict[MetricSpec, Iterable[Sample]]]


def _base(spec: MetricSpec) -> str:
    return spec.name[: -len("_total")] if spec.name.endswith("_total") else spec.name


class _ExactCounters:
    """Exposes counters under their exact names (no `_total`), untyped, as Triton names them."""

    def __init__(self):
        self.counters: dict[MetricSpec, Counter] = {}

    def collect(self):
        for spec, counter in self.counters.items():
            family = Metric(spec.name, spec.help, "unknown")
            for metric in counter.collect():
                for s in metric.samples:
                    if s.name.endswith("_total"):
                        family.add_sample(spec.name, s.labels, s.value)
            yield family


class _Readings:
    """The daemon's readings, collected at scrape time; a reader that fails costs its families, not the scrape."""

    def __init__(self, specs: list[MetricSpec]):
        self.specs = specs
        self.readers: list[Reader] = []

    def collect(self):
        samples: dict[MetricSpec, list[Sample]] = {s: [] for s in self.specs}
        for reader in self.readers:
            try:
                for spec, values in reader().items():
                    samples[spec].extend(values)
            except Exception:
                log.exception("metrics: a reader failed; its metrics are left out of this scrape")
        for spec in self.specs:
            labels = list(spec.labels)
            if spec.kind is Kind.COUNTER:
                family = CounterMetricFamily(_base(spec), spec.help, labels=labels)
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=labels)
            for values, value in samples[spec]:
                family.add_metric([str(v) for v in values], float(value))
            yield family


class DaemonMetrics:
    """One daemon's metrics: every spec of `daemon` in the contract, in a registry of its own."""

    def __init__(self, daemon: Daemon, *, process: bool = True):
        self.daemon = daemon
        self.registry = CollectorRegistry()
        self._instruments: dict[MetricSpec, Counter | Gauge | Histogram] = {}
        exact = _ExactCounters()
        collected = [s for s in for_daemon(daemon) if s.collected]
        for spec in for_daemon(daemon):
            if spec.collected:
                continue
            if spec.kind is Kind.EXACT_COUNTER:
                exact.counters[spec] = Counter(spec.name, spec.help, spec.labels, registry=None)
                self._instruments[spec] = exact.counters[spec]
            elif spec.kind is Kind.COUNTER:
                self._instruments[spec] = Counter(_base(spec), spec.help, spec.labels, registry=self.registry)
            elif spec.kind is Kind.HISTOGRAM:
                self._instruments[spec] = Histogram(
                    spec.name, spec.help, spec.labels, registry=self.registry, buckets=spec.buckets
                )
            else:
                self._instruments[spec] = Gauge(spec.name, spec.help, spec.labels, registry=self.registry)
        if exact.counters:
            self.registry.register(exact)
        self._readings = _Readings(collected)
        if collected:
            self.registry.register(self._readings)
        if process:
            ProcessCollector(registry=self.registry)

    def counter(self, spec: MetricSpec) -> Counter:
        return self._instrument(spec, Counter)

    def histogram(self, spec: MetricSpec) -> Histogram:
        return self._instrument(spec, Histogram)

    def _instrument(self, spec: MetricSpec, kind: type):
        instrument = self._instruments.get(spec)
        if not isinstance(instrument, kind):
            raise KeyError(f"{spec.name}: not a {kind.__name__} of the {self.daemon.value}'s metrics")
        return instrument

    def add_reader(self, reader: Reader) -> None:
        """`reader()` -> {spec: [(label values, value), ...]} for this daemon's collected specs."""
        self._readings.readers.append(reader)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def response(self) -> Response:
        return Response(self.exposition(), mimetype=CONTENT_TYPE_LATEST)

    def serve(self, app: Flask, token: str | None) -> None:
        """`GET /metrics` on `app`. With `token`, it needs `Authorization: Bearer <token>` (the
        cluster token: Prometheus's `authorization.credentials_file`), like every other route of the
        daemon but `/healthz`; a function's own token is refused (401)."""

        @app.get("/metrics")
        def metrics():
            if token is not None and not token_matches(bearer_token(flask_request.headers.get("Authorization")), token):
                return unauthorized()
            return self.response()
