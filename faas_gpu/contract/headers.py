"""HTTP header names that cross processes, each named once.

Why constants and not literals: a header is protocol between two processes (the gateway and an
instance, an instance and the scheduler, the scheduler and a GPU Manager); a typo in one of them
is a silent mismatch, not an error. Our own headers start with `X-Faas-Gpu-` (DESIGN: additions
to OpenFaaS are namespaced); the OpenFaaS ones are the names its gateway and watchdog use.

Parsers live beside the facts they read: the class and SLO in `slo`, the error code in `errors`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PREFIX = "X-Faas-Gpu-"
"""Ours: the scheduler passes on a manager's, the instance a job's (`ours`)."""

# -- request: the function's caller -> gateway -> instance ------------------------------------
CLASS = "X-Faas-Gpu-Class"
"""PROTEAN's request class: `strict` or `best-effort` (`slo.parse_class`)."""
SLO_MS = "X-Faas-Gpu-Slo-Ms"
"""The request's SLO: a budget in milliseconds from its arrival (`slo.parse_slo_ms`)."""
APP = "X-Faas-Gpu-App"
"""HarmonyBatch's application (request class) of a call; the gateway sets it when it picks one."""

# -- job: instance -> scheduler -> GPU Manager -------------------------------------------------
BUDGET_MS = "X-Faas-Gpu-Deadline-Ms"
"""The budget *left* to a job, in milliseconds (`slo.parse_budget_ms`): the instance sends what
remains of the SLO on each attempt; the scheduler turns it into an absolute deadline once, when it
admits the job. (The name says deadline for history; on the wire it is always a budget.)"""
MODEL = "X-Faas-Gpu-Model"
"""The model's name (PROTEAN's assumptions file), a label for the GPU Reconfigurator."""
SHARE = "X-Faas-Gpu-Share"
"""The instance's GPU SM share (INFless), as a whole percentage."""
FUNCTION = "X-Faas-Gpu-Function"
"""name.namespace of the function a job came from: the GPU Manager counts jobs by it (accounting)."""
LEASE = "X-Faas-Gpu-Lease"
"""A placement lease (`lease`): with the function's own token, lets its instance send a batch
straight to the leased unit's GPU Manager."""
MODEL_SOURCE = "X-Faas-Gpu-Model-Source"
"""On an upload: the SHA-256 of what the artifact was made from (`faas_gpu.saving.source_digest`):
a later replica of the same function asks the scheduler for the digest instead of exporting again."""
MODEL_DIGEST = "X-Model-Digest"
"""On an upload: the SHA-256 the client computed; the store refuses bytes that hash otherwise."""

# -- answers ---------------------------------------------------------------------------------
UNIT = "X-Faas-Gpu-Unit"
CACHE = "X-Faas-Gpu-Cache"
"""`hit` or `miss`: whether the model was resident on the unit."""
LOAD_SECONDS = "X-Faas-Gpu-Load-Seconds"
LOAD_SPLIT = "X-Faas-Gpu-Load-Split"
"""On a miss: where the load's seconds went,
`spawn=0.004;read=0.47;to_device=0.04;optimize=0.01;warmup=0.02` (spawn: a fresh worker process or
the hand-over of a pooled one; optimize: the cpu back end's inference rewrites and their check;
warm-up: one batch of the model's example input before it served). Informative: nothing acts on it."""
EXECUTE_SECONDS = "X-Faas-Gpu-Execute-Seconds"
MODEL_MB = "X-Faas-Gpu-Model-Mb"
"""What the model is charged on its unit after the job, in MB: its measured cost (CUDA context,
weights, peak activations) where the manager measures it; the scheduler's fit checks learn it."""
QUEUE_SECONDS = "X-Faas-Gpu-Queue-Seconds"
BATCH = "X-Faas-Gpu-Batch"
"""Rows in the batch the call ran in (set by the instance's batch queue)."""
UNIT_STATE = "X-Faas-Gpu-Unit-State"
"""On a job a manager refused: `draining` (its GPU is being reconfigured) or `unknown` (gone)."""
UNIT_STATES = ("draining", "unknown")
DEADLINE_MISSED = "X-Faas-Gpu-Deadline-Missed"
"""`true` on an answer whose job missed its deadline: the instance does not retry it."""
ERROR = "X-Faas-Gpu-Error"
"""A machine-readable error code (`errors.ContractError.code`): what a caller acts on, never the text."""
UPLOAD_SECONDS = "X-Faas-Gpu-Upload-Seconds"
"""On the answer of a replica's first batch: the seconds the instance spent on its model's artifact
before the batch could go (torch.export, unless an earlier replica's artifact was known, and the
upload): the export/upload part of a cold start."""
COLD_START_SECONDS = "X-Faas-Gpu-Cold-Start-Seconds"
"""Set by the gateway on the answer to a call that found no ready replica (a function at zero, or
one still starting): the seconds it waited for one. On a 503/504 after such a wait too."""
SHOWN_BY_INSTANCE = (UNIT, CACHE, BATCH, LOAD_SECONDS, EXECUTE_SECONDS, UPLOAD_SECONDS)
"""What a python3-gpu instance copies from its last job onto its response."""

# -- OpenFaaS -------------------------------------------------------------------------------
CALL_ID = "X-Call-Id"
START_TIME = "X-Start-Time"
DURATION_SECONDS = "X-Duration-Seconds"
CALLBACK_URL = "X-Callback-Url"

# -- W3C Trace Context (`faas_gpu.tracing`): passed on by every hop, gateway to GPU Manager ---------
TRACEPARENT = "traceparent"
"""The caller's span: version-traceid-spanid-flags (W3C Trace Context). Header names are
case-insensitive; the gateway's WSGI layer spells it `Traceparent`."""
TRACESTATE = "tracestate"
TRACE_CONTEXT = (TRACEPARENT, TRACESTATE)

TENSOR_TYPE = "application/x-faas-gpu-tensor"
"""The content type of a `wire` tensor message."""


def ours(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Our headers of a response (`X-Faas-Gpu-*`), as a plain dict, to pass on."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {k: v for k, v in items if k.startswith(PREFIX)}
