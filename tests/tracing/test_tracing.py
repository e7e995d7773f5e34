"""faas_gpu.tracing: off costs nothing, W3C context crosses hops, a batch's span links its calls."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from faas_gpu import tracing
from faas_gpu.batching import BatchQueue


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert tracing.configure("test", environ={}, exporter=exporter)
    yield exporter
    tracing.shutdown()


def test_off_by_default_makes_no_sdk_object_and_imports_no_opentelemetry():
    """The instance's path (tracing, the batch queue) imports no OpenTelemetry module while off.
    (The daemons' redis client imports OpenTelemetry's API itself when it is installed; ours makes
    nothing of it.)"""
    code = (
        "import sys\n"
        "from faas_gpu import tracing\n"
        "import faas_gpu.batching\n"
        "assert not tracing.configure('x', environ={})\n"
        "with tracing.span('a') as s: assert s is None\n"
        "h = {'traceparent': 'x'}; assert tracing.inject(h) is h and h == {'traceparent': 'x'}\n"
        "assert tracing.current() is None and tracing.extract(h) is None\n"
        "assert tracing._provider is None and tracing._tracer is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={})
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"FAAS_GPU_TRACES_FILE": "/tmp/t.jsonl"}, ["file"]),
    ],
)
def test_the_environment_names_the_exporters(environ, wanted):
    assert tracing.exporters_wanted(environ) == wanted


def test_a_hop_continues_the_callers_trace_whatever_the_header_case(spans):
    with tracing.span("caller", kind="client"):
        headers = tracing.inject({"Traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert set(headers) == {"traceparent"}  # the stale one replaced, not doubled
    with tracing.server_span("callee", {"Traceparent": headers["traceparent"]}):
        pass
    caller, callee = spans.get_finished_spans()
    assert callee.parent.span_id == caller.context.span_id
    assert callee.context.trace_id == caller.context.trace_id


def test_a_batch_has_the_first_call_as_parent_and_links_every_call(spans):
    seen: list[dict] = []

    def run(x, _cls):
        with tracing.span("scheduler.request", kind="client"):
            seen.append(tracing.inject({}))
        return x * 2, {}

    queue = BatchQueue(run, max_batch=2, timeout_s=5.0)
    barrier = threading.Barrier(2)
    out = {}

    def call(i):
        with tracing.span(f"instance.handle-{i}", kind="server"):
            barrier.wait()
            out[i] = queue(torch.ones(1, 1) * i)

    threads = [threading.Thread(target=call, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out[1].item() == 2 and out[2].item() == 4
    by = {s.name: s for s in spans.get_finished_spans()}
    handles = [by["instance.handle-1"], by["instance.handle-2"]]
    batch = by["instance.batch"]
    assert batch.attributes["faas_gpu.batch.calls"] == 2
    assert batch.parent.span_id in {h.context.span_id for h in handles}
    assert {link.context.span_id for link in batch.links} == {h.context.span_id for h in handles}
    waits = [s for s in spans.get_finished_spans() if s.name == "instance.batch_wait"]
    assert {w.parent.span_id for w in waits} == {h.context.span_id for h in handles}
    assert by["scheduler.request"].parent.span_id == batch.context.span_id
    assert seen[0]["traceparent"].split("-")[2] == f"{by['scheduler.request'].context.span_id:016x}"
