"""python3-gpu entry point: python3-http's index.py, served two ways.

- In the watchdog's process (the template's `mode=inproc`): the watchdog imports this file and
  calls `handle_http` per request, with the request it has parsed; no second server, no WSGI.
- As its own server (`mode=http`, or `python index.py`): Flask served by waitress on the host and
  port of env `upstream_url` (default http://127.0.0.1:5000), so that several replicas can share
  one host.

Both give the handler the same `event` and `context` and turn what it returns into the same
answer (`_answer`: Flask's own conversion where the fast one does not apply). The handler module
is imported once, at start-up: a model loaded at import time is loaded once per instance.

A handler whose answer's `body` is a generator or another iterator of str or bytes (or that
returns one, as a Flask view may) has its answer streamed: the status and headers first, then
each item as a chunk as it is yielded (`_stream`; the watchdog's `streams` module, or waitress in
http mode, sends them).
"""

import os
import traceback
from collections.abc import Iterator
from urllib.parse import parse_qsl, unquote, urlsplit

from flask import Flask, request
from werkzeug.datastructures import Headers, ImmutableMultiDict

try:  # the GPU client ships with faas-gpu's stack; a plain image runs its models as they are
    from faas_gpu import client as gpu_client
    from faas_gpu import tracing as gpu_tracing
    from faas_gpu.contract import env as gpu_env
    from faas_gpu.contract import headers as gpu_headers
    from faas_gpu.contract.slo import read_request
except ImportError:
    gpu_client = gpu_env = gpu_headers = read_request = gpu_tracing = None
if gpu_client is not None:
    # traces: the watchdog passes the gateway's traceparent on; the GPU client passes ours on
    gpu_tracing.configure(f"faas-gpu-function:{gpu_env.FUNCTION.read() or 'instance'}")
    # with a scheduler, torch.export.load / torch.load / torch.jit.load return models that run on GPU
    # units; without one, torch.load only explains a whole-module pickle it cannot load
    gpu_client.install()
else:
    print("faas-gpu: no scheduler configured; models run locally on the CPU", flush=True)

READY_PATH = "/_/ready"
"""The template's readiness check (its Dockerfile's `ready_path`): the watchdog asks it before the
replica is Ready (faas_gpu.contract.readiness). The watchdog routes `/_/ready` itself, so no call
from outside reaches this path of the handler."""

try:
    from function import handler  # noqa: E402 — after the loaders are swapped
except Exception as exc:  # noqa: BLE001 — the handler's import-time code: any failure
    # Say why instead of exiting: a replica that exits is restarted and fails again (a crash loop
    # whose reason is buried in restarts). The readiness check answers 500 with what went wrong
    # and what to do (the GPU client's errors say how to save a model), so the replica is never
    # Ready (describe shows the reason, a rollout to it stalls while the old version serves), and
    # a call that reaches it anyway is answered 500 with the same words, as AWS Lambda answers an
    # init error on each invoke.
    traceback.print_exc()
    handler = None
    _import_error = f"the handler failed to load: {type(exc).__name__}: {exc}\n"
    print(f"python3-gpu: {_import_error}", flush=True)


def _ready():
    """The readiness check: 200 once the handler has loaded, 500 with the reason when it cannot."""
    if handler is None:
        return 500, [("Content-Type", "text/plain")], _import_error.encode()
    return 200, [("Content-Type", "text/plain")], b"OK"


def _apply_instance_resources():
    """The CPU share the autoscaler gave this instance wins over what the handler set at import."""
    # an image without faas-gpu reads the variable itself; with it, the contract's parser
    threads = gpu_env.CPU_THREADS.read() if gpu_env is not None else int(os.getenv("FAAS_GPU_CPU_THREADS") or 0)
    if threads:
        import torch

        torch.set_num_threads(threads)


_apply_instance_resources()

app = Flask(__name__)


class _Headers(Headers):
    """werkzeug's `Headers`, as python3-http's `event.headers` are, with two costs of the
    in-process call taken out (issue 20: together ~10% of an instance's CPU at batch 8):
    `get` of an absent header returns the default at once, where werkzeug's raises and catches
    a `BadRequestKeyError` (the contract's absent headers are read on every call), and
    `from_items` takes the watchdog's parsed pairs as they are, without `extend`'s checks (the
    watchdog has already refused names and values that are not valid)."""

    __slots__ = ()

    @classmethod
    def from_items(cls, items):
        made = cls()
        made._list = list(items)  # what Headers(items) holds, as (str, str) pairs in order
        return made

    def get(self, key, default=None, type=None):  # noqa: A002 — werkzeug's signature
        if isinstance(key, str):
            ikey = key.lower()
            if not any(k.lower() == ikey for k, _ in self._list):
                return default
        return super().get(key, default, type)


class Event:
    """What python3-http's handlers get: the body, werkzeug headers and query, method, path."""

    __slots__ = ("body", "headers", "method", "query", "path")

    def __init__(self, body, headers, method, query, path):
        self.body, self.headers, self.method, self.query, self.path = body, headers, method, query, path


class Context:
    def __init__(self):
        self.hostname = os.getenv("HOSTNAME", "localhost")


_CONTEXT = Context()


def _request_class(headers):
    """(class, SLO ms) from X-Faas-Gpu-Class / X-Faas-Gpu-Slo-Ms, by the contract's one parser (the
    gateway has answered 400 to bad ones; one that reaches the instance directly counts as absent)."""
    asked = read_request(headers)
    return (asked.request_class.value if asked.request_class else None), asked.slo_ms


def _instance_threads():
    """A batch of B needs B requests in flight at once (`faas_gpu.contract.env.instance_threads`)."""
    if gpu_env is not None:
        return gpu_env.instance_threads()
    return max(8, 2 * int(os.getenv("FAAS_GPU_MAX_BATCH") or 1))  # an image without faas-gpu


def format_status_code(res):
    return res.get("statusCode", 200) if isinstance(res, dict) else 200


def format_headers(res):
    if "headers" not in res:
        return []
    if isinstance(res["headers"], dict):
        return list(res["headers"].items())
    return res["headers"]


def get_content_type(res):
    content_type = ""
    if "headers" in res and isinstance(res["headers"], dict):
        content_type = res["headers"].get("Content-type", "")
    return content_type


def _call(event):
    """The handler's answer to `event` as (status, [(header, value)], body bytes), what Flask
    would send for python3-http's conversions of it; an exception is this call's error. A body
    that is a generator or another iterator is streamed: the body is then an iterator of bytes."""
    headers = event.headers
    if handler is None:
        return 500, [("Content-Type", "text/plain")], _import_error.encode()
    if gpu_client is not None:
        gpu_client.last_job.set(None)
        gpu_client.current_app.set(headers.get(gpu_headers.APP))
        gpu_client.request_class.set(_request_class(headers))
    try:
        if gpu_tracing is not None and gpu_tracing.enabled():
            with gpu_tracing.server_span("instance.handle", headers, {"http.method": event.method}):
                res = handler.handle(event, _CONTEXT)
        else:
            res = handler.handle(event, _CONTEXT)
    except Exception as exc:  # the instance keeps serving; the caller gets the error
        return _error(exc)
    status, out, data = _answer(res)
    if not isinstance(data, bytes):
        try:  # a streamed body: its first item now, so that a failure before it is a plain error
            data = _stream(data)
        except Exception as exc:
            return _error(exc)
    job = gpu_client.last_job.get() if gpu_client is not None else None
    if job:  # which unit ran the model, whether it was a cache hit, and the batch it ran in
        shown = {k.lower() for k in gpu_headers.SHOWN_BY_INSTANCE if k in job}
        out = [(k, v) for k, v in out if k.lower() not in shown]
        out.extend((k, job[k]) for k in gpu_headers.SHOWN_BY_INSTANCE if k in job)
    return status, out, data


def _error(exc):
    traceback.print_exc()
    status = getattr(exc, "status", 500)  # the GPU client's errors keep theirs (400, 503, 507)
    return (
        status if isinstance(status, int) else 500,
        [("Content-Type", "text/plain")],
        f"{type(exc).__name__}: {exc}\n".encode(),
    )


def _chunk(item, index):
    """One item of a streamed body as bytes: str as UTF-8, bytes as they are; any other type is
    the handler's error (a number or a dict has no one encoding: yield json.dumps(x) + "\\n")."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    raise TypeError(f"item {index} of the streamed body is {type(item).__name__}: a streamed body yields str or bytes")


def _stream(items):
    """A streamed body (a generator or any iterator of str or bytes) as an iterator of bytes, its
    first item read already: an exception or a wrong type before it is answered as a handler's
    error (500 and why, nothing sent yet). After it, the watchdog (or waitress, in http mode)
    sends each item as a chunk; an exception or a wrong type then cuts the answer short.
    Closing what this returns closes the handler's iterator (GeneratorExit at its yield)."""
    it = iter(items)
    try:
        first = _chunk(next(it), 0)
    except StopIteration:
        first = None
    except BaseException:
        _close(it)
        raise
    return _chunks(it, first)


def _chunks(it, first):
    try:
        if first is not None:
            yield first
        for index, item in enumerate(it, start=1):
            yield _chunk(item, index)
    except GeneratorExit:  # the caller went away, or the stream was cut: nothing to report
        raise
    except Exception:
        traceback.print_exc()  # the watchdog logs the cut; the traceback says where
        raise
    finally:
        _close(it)


def _close(it):
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _streams(body):
    """A body to stream: an iterator (a generator, a file); a list or a string is not one."""
    return isinstance(body, Iterator) and not isinstance(body, str | bytes)


_HTML = ("Content-Type", "text/html; charset=utf-8")  # Flask's default mimetype


def _answer(res):
    """python3-http's conversion (a dict's statusCode, headers and body; a dict body as JSON)
    and then Flask's `make_response`, without Flask for the shapes handlers return (None, str,
    bytes, a dict with a dict, str or bytes body), with it for the rest (tuples, lists,
    Response objects)."""
    if res is None:
        return 200, [_HTML], b""
    if isinstance(res, str | bytes):
        return 200, [_HTML], res.encode() if isinstance(res, str) else res
    if _streams(res):  # Flask streams a generator a view returns
        return 200, [_HTML], res
    if not isinstance(res, dict):
        return _flask_answer(res)
    status = format_status_code(res)
    headers = format_headers(res)
    octet = get_content_type(res) == "application/octet-stream"
    body = res.get("body", "")
    if _streams(body) and isinstance(status, int) and isinstance(headers, list):
        out = list(headers)
        if not any(k.lower() == "content-type" for k, _ in out):
            out.append(_HTML)
        return status, out, body
    if not octet and isinstance(body, dict):
        # jsonify: the app's JSON provider, compact; Flask's tuple conversion then *updates* its
        # headers (a handler's Content-Type replaces application/json)
        data = (app.json.dumps(body, separators=(",", ":")) + "\n").encode()
        merged = {"content-type": ("Content-Type", app.json.mimetype)}
        for k, v in headers:
            merged[k.lower()] = (k, v)
        return status, list(merged.values()), data
    if not octet and "body" in res:
        body = str(body)
    if not (isinstance(body, str | bytes) and isinstance(status, int) and isinstance(headers, list)):
        return _flask_answer((body, status, headers))
    out = list(headers)
    if not any(k.lower() == "content-type" for k, _ in out):
        out.append(_HTML)
    return status, out, body.encode() if isinstance(body, str) else body


def _flask_answer(rv):
    with app.app_context():
        resp = app.make_response(rv)
        if resp.is_streamed:  # a generator in a tuple, or a streamed Response: streamed here too
            headers = [(k, v) for k, v in resp.headers.to_wsgi_list() if k.lower() != "content-length"]
            return resp.status_code, headers, resp.response
        return resp.status_code, resp.headers.to_wsgi_list(), resp.get_data()


def handle_http(method, path, query, headers, body):
    """One call, from the watchdog's `mode=inproc`: `headers` as the watchdog parsed them;
    (status, [(header, value)], body bytes, or an iterator of bytes for a streamed body)."""
    if path == READY_PATH and method == "GET":
        return _ready()
    event = Event(
        body,
        _Headers.from_items(headers.items()),
        method,
        ImmutableMultiDict(parse_qsl(query, keep_blank_values=True)) if query else ImmutableMultiDict(),
        unquote(path, errors="replace"),
    )
    return _call(event)


@app.route(READY_PATH, methods=["GET"])
def ready_check():
    status, headers, data = _ready()
    return app.response_class(data, status=status, headers=headers)


@app.route("/", defaults={"path": ""}, methods=["GET", "PUT", "POST", "PATCH", "DELETE"])
@app.route("/<path:path>", methods=["GET", "PUT", "POST", "PATCH", "DELETE"])
def call_handler(path):
    event = Event(request.get_data(), request.headers, request.method, request.args, request.path)
    status, headers, data = _call(event)
    return app.response_class(data, status=status, headers=headers)


if __name__ == "__main__":
    from waitress import serve

    upstream = urlsplit(os.getenv("upstream_url", "http://127.0.0.1:5000"))
    serve(
        app,
        host=upstream.hostname or "127.0.0.1",
        port=upstream.port or 5000,
        # a batch of B needs B requests in flight at once
        threads=int(os.getenv("handler_threads") or _instance_threads()),
        # requests wait in the batch queue while the model loads: do not stop accepting them
        connection_limit=int(os.getenv("max_connections", "1000")),
        ident="python3-gpu",
    )
