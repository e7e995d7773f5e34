"""Traces across the request path, with OpenTelemetry: one setup for every daemon and the instance.

The path of one call is gateway -> watchdog -> `index.py` -> GPU client (batch queue) -> scheduler
-> GPU Manager and back (docs/ARCHITECTURE.md). Each hop passes W3C Trace Context on
(`traceparent`, `tracestate`: `contract.headers.TRACE_CONTEXT`) and makes its spans:

| span | where | what it times |
| --- | --- | --- |
| `gateway.invoke` (server), `gateway.forward` (client) | provider/gateway.py | the gateway hop, the hop to a replica |
| `instance.handle` (server) | templates/python3-gpu/index.py | the handler |
| `instance.batch_wait` | faas_gpu/batching.py | one call waiting for its batch to fill |
| `instance.batch` | faas_gpu/batching.py | one batch: parent the first call, linked to every call |
| `scheduler.request` (client) | faas_gpu/client.py | the hop to the scheduler (upload or job) |
| `scheduler.job` (server), `scheduler.queue` | scheduler/api.py, loop.py | admission, the class queue's wait |
| `scheduler.dispatch` (client) | scheduler/loop.py | the hop to the GPU Manager |
| `gpu_manager.job` (server), `.unit_wait`, `.load`, `.execute` | gpu_manager/ | the unit's lock, a cold load, the run |

Off unless configured, with OpenTelemetry's own variables: `OTEL_TRACES_EXPORTER` (`otlp`,
`console`, `none`; unset means `otlp` when `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, else off), `OTEL_SDK_DISABLED`, `OTEL_SERVICE_NAME`,
and faas-gpu's `FAAS_GPU_TRACES_FILE` (spans as JSON lines in a file, written as each ends: what the
end-to-end test reads). Why off costs nothing: while `configure` has not turned it on, no
OpenTelemetry module is imported and no SDK object exists; `span` returns one shared null context,
`inject` and `current` return at once after a test of one global.

A batch serves many calls, each with its own trace: its span's parent is the first call's span
and it carries an OpenTelemetry span link to every call's span, as OTel's messaging conventions do
for a batch (a span has one parent; links are how a trace viewer reaches the others).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faas_gpu.contract import env
from faas_gpu.contract import headers as h

log = logging.getLogger(__name__)

_tracer: Any = None
"""The OpenTelemetry tracer while tracing is on; None (the hot path's one test) while off."""
_provider: Any = None
_NULL = contextlib.nullcontext()
_TRACE_KEYS = frozenset(h.TRACE_CONTEXT)


@dataclass(frozen=True)
class Carried:
    """A span's context taken from one thread to another (a call into its batch, a job into the
    scheduler's loop), with the wall time it was taken: where a waiting span starts."""

    context: Any
    at_ns: int


def enabled() -> bool:
    return _tracer is not None


def exporters_wanted(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporters the environment asks for ([] when tracing is off), by OpenTelemetry's variables
    and `FAAS_GPU_TRACES_FILE`; `file` stands for the latter."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        wanted = [n.strip() for n in named.split(",") if n.strip() and n.strip() != "none"]
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        wanted = ["otlp"]
    else:
        wanted = []
    if env.TRACES_FILE.is_set(environ):
        wanted.append("file")
    return wanted


def configure(service: str, environ: Mapping[str, str] | None = None, exporter: Any = None) -> bool:
    """Turn tracing on for this process when the environment asks (or `exporter`, an SDK
    `SpanExporter`, is given: tests pass an in-memory one). Call once per process, after any fork
    (a gunicorn worker, not its master). True when on."""
    global _tracer, _provider
    environ = os.environ if environ is None else environ
    wanted = exporters_wanted(environ)
    if exporter is None and not wanted:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as exc:  # an instance image without the SDK: serve untraced, say why once
        log.warning("tracing asked for (%s) but OpenTelemetry's SDK is not installed: %s", ",".join(wanted), exc)
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in wanted:
        if name == "file":
            provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(env.TRACES_FILE.read(environ))))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            if protocol and protocol != "http/protobuf":
                log.warning("OTLP protocol %s is not shipped; exporting over http/protobuf", protocol)
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError as exc:
                log.warning("OTLP export asked for but not installed (pip install faas-gpu[otlp]): %s", exc)
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not one faas-gpu ships (otlp, console, none); ignored", name)
    _provider = provider
    _tracer = provider.get_tracer("faas_gpu")
    return True


def shutdown() -> None:
    """Flush and turn tracing off (tests; a daemon's exit flushes through the SDK's atexit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


INHERITED_FD = "/dev/fd/"
"""A traces file named /dev/fd/<n> is that descriptor, already open: a sandboxed instance may not open
the stack's traces file itself, so its launcher opens it for it (`faas_gpu.sandbox`, `files`)."""


class JsonLinesExporter:
    """An SDK `SpanExporter` that appends each span as one JSON line (`ReadableSpan.to_json`) to a
    file that several processes share: one `write` per span on an O_APPEND descriptor."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        number = str(path).removeprefix(INHERITED_FD)
        self._fd = int(number) if str(path).startswith(INHERITED_FD) and number.isdigit() else None

    def export(self, spans) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        data = "".join(s.to_json(indent=None) + "\n" for s in spans).encode()
        with self._lock:
            if self._fd is not None:
                os.write(self._fd, data)
                return SpanExportResult.SUCCESS
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# -- W3C Trace Context ------------------------------------------------------------------------
class _Getter:
    """Reads a carrier's headers whatever their case (`Traceparent` from WSGI, `traceparent` on the wire)."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            for k, v in carrier.items():
                if k.lower() == key:
                    value = v
                    break
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return [k.lower() for k in carrier]


_GETTER = _Getter()


def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def extract(headers: Mapping[str, str]) -> Any:
    """The caller's span context from `traceparent` (an OpenTelemetry Context; None when off)."""
    if _tracer is None:
        return None
    return _propagator().extract(headers, getter=_GETTER)


def inject(headers: MutableMapping[str, str], context: Any = None) -> MutableMapping[str, str]:
    """`headers` with this thread's (or `context`'s) span as `traceparent`, in place of whatever
    trace context the headers carried in; unchanged while tracing is off."""
    if _tracer is None:
        return headers
    for key in [k for k in headers if k.lower() in _TRACE_KEYS]:
        del headers[key]
    if isinstance(context, Carried):
        context = context.context
    _propagator().inject(headers, context=context)
    return headers


def current() -> Carried | None:
    """This thread's span context and the time now, to carry to another thread; None while off."""
    if _tracer is None:
        return None
    from opentelemetry import context

    return Carried(context.get_current(), time.time_ns())


# -- spans ------------------------------------------------------------------------------------
def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return {"server": SpanKind.SERVER, "client": SpanKind.CLIENT}.get(kind, SpanKind.INTERNAL)


def span(
    name: str,
    parent: Carried | Any = None,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    links: Iterable[Carried | None] = (),
    start_ns: int | None = None,
) -> contextlib.AbstractContextManager:
    """A span around a block, current in this thread while it runs, child of `parent` (a `Carried`
    or an OpenTelemetry Context; None: this thread's current span), linked to each of `links`.
    While tracing is off: one shared null context, nothing made."""
    if _tracer is None:
        return _NULL
    return _span(name, parent, kind, attributes, links, start_ns)


@contextlib.contextmanager
def _span(name, parent, kind, attributes, links, start_ns) -> Iterator[Any]:
    from opentelemetry import trace

    if isinstance(parent, Carried):
        parent = parent.context
    span_links = [trace.Link(trace.get_current_span(c.context).get_span_context()) for c in links if c is not None]
    with _tracer.start_as_current_span(
        name, context=parent, kind=_kind(kind), attributes=attributes, links=span_links, start_time=start_ns
    ) as sp:
        yield sp


def server_span(name: str, headers: Mapping[str, str], attributes: Mapping[str, Any] | None = None):
    """A server span whose parent is the caller's `traceparent` (a new trace when it has none)."""
    if _tracer is None:
        return _NULL
    return _span(name, extract(headers), "server", attributes, (), None)


def record(
    name: str, parent: Carried | None, start_ns: int, end_ns: int | None = None, attributes: Mapping | None = None
) -> None:
    """A span that has already happened (a wait measured from its two ends), child of `parent`."""
    if _tracer is None or parent is None:
        return
    sp = _tracer.start_span(name, context=parent.context, attributes=attributes, start_time=start_ns)
    sp.end(end_time=end_ns if end_ns is not None else time.time_ns())


def set_attributes(sp: Any, **attributes: Any) -> None:
    """Attributes on the span `span` yielded (None while off: nothing to set)."""
    if sp is not None:
        sp.set_attributes({k: v for k, v in attributes.items() if v is not None})
