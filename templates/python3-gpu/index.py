"""python3-gpu entry point: python3-http's index.py (Flask served by waitress).

It listens on the host and port of env `upstream_url` (default http://127.0.0.1:5000), so that
several replicas can share one host. The handler module is imported once, at start-up: a model
loaded at import time is loaded once per instance.
"""

import os
import traceback
from urllib.parse import urlsplit

from flask import Flask, jsonify, request
from waitress import serve

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

try:
    from function import handler  # noqa: E402 — after the loaders are swapped
except Exception as exc:  # noqa: BLE001 — the handler's import-time code: any failure
    # Serve the failure instead of exiting: a replica that exits is restarted and fails again (a
    # crash loop whose reason is buried in restarts); this one answers every call 500 with what
    # went wrong and what to do (the GPU client's errors say how to save a model), as AWS Lambda
    # answers an init error on each invoke.
    traceback.print_exc()
    handler = None
    _import_error = f"the handler failed to load: {type(exc).__name__}: {exc}\n"
    print(f"python3-gpu: {_import_error}", flush=True)


def _apply_instance_resources():
    """The CPU share the autoscaler gave this instance wins over what the handler set at import."""
    # an image without faas-gpu reads the variable itself; with it, the contract's parser
    threads = gpu_env.CPU_THREADS.read() if gpu_env is not None else int(os.getenv("FAAS_GPU_CPU_THREADS") or 0)
    if threads:
        import torch

        torch.set_num_threads(threads)


_apply_instance_resources()

app = Flask(__name__)


class Event:
    def __init__(self):
        self.body = request.get_data()
        self.headers = request.headers
        self.method = request.method
        self.query = request.args
        self.path = request.path


class Context:
    def __init__(self):
        self.hostname = os.getenv("HOSTNAME", "localhost")


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


def format_body(res, content_type):
    if content_type == "application/octet-stream":
        return res["body"]
    if "body" not in res:
        return ""
    if isinstance(res["body"], dict):
        return jsonify(res["body"])
    return str(res["body"])


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


def format_response(res):
    if res is None:
        return ("", 200)
    if isinstance(res, dict):
        status_code = format_status_code(res)
        content_type = get_content_type(res)
        body = format_body(res, content_type)
        headers = format_headers(res)
        return (body, status_code, headers)
    return res


@app.route("/", defaults={"path": ""}, methods=["GET", "PUT", "POST", "PATCH", "DELETE"])
@app.route("/<path:path>", methods=["GET", "PUT", "POST", "PATCH", "DELETE"])
def call_handler(path):
    if handler is None:
        return (_import_error, 500, [("Content-Type", "text/plain")])
    event = Event()
    context = Context()
    if gpu_client is not None:
        gpu_client.last_job.set(None)
        gpu_client.current_app.set(request.headers.get(gpu_headers.APP))
        gpu_client.request_class.set(_request_class(request.headers))
    try:
        if gpu_tracing is not None and gpu_tracing.enabled():
            with gpu_tracing.server_span("instance.handle", request.headers, {"http.method": request.method}):
                response_data = handler.handle(event, context)
        else:
            response_data = handler.handle(event, context)
    except Exception as exc:  # the instance keeps serving; the caller gets the error
        traceback.print_exc()
        status = getattr(exc, "status", 500)  # the GPU client's errors keep theirs (400, 503, 507)
        return (
            f"{type(exc).__name__}: {exc}\n",
            status if isinstance(status, int) else 500,
            [("Content-Type", "text/plain")],
        )
    response = app.make_response(format_response(response_data))
    job = gpu_client.last_job.get() if gpu_client is not None else None
    if job:  # which unit ran the model, whether it was a cache hit, and the batch it ran in
        for key in gpu_headers.SHOWN_BY_INSTANCE:
            if key in job:
                response.headers[key] = job[key]
    return response


if __name__ == "__main__":
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
