"""`faas-gpu up`'s wait for each function (issue 45, found by the keep-alive replay after the
readiness work): a scale-zero function its keep-alive took to zero before its first replica was
ready has nothing to wait for; one still starting is waited for. A real HTTP gateway stand-in."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from faas_gpu.cli.common import Client
from faas_gpu.cli.up import wait_ready
from faas_gpu.ports import free_port

FUNCTIONS = {
    "at-zero": {"name": "at-zero", "replicas": 0, "availableReplicas": 0},
    "starting": {"name": "starting", "replicas": 1, "availableReplicas": 0},
    "serving": {"name": "serving", "replicas": 1, "availableReplicas": 1},
}


class _Gateway(BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_GET(self):
        body = json.dumps(FUNCTIONS[self.path.rsplit("/", 1)[-1].split("?")[0]]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Client(f"http://127.0.0.1:{server.server_port}", ("admin", "x"))
    server.shutdown()


def test_a_function_its_keep_alive_took_to_zero_is_not_waited_for(gateway):
    assert wait_ready(gateway, "at-zero", None, timeout_s=60, progress=False)


def test_a_function_whose_replica_is_not_ready_yet_is_still_waited_for(gateway):
    assert wait_ready(gateway, "serving", None, timeout_s=60, progress=False)
    assert not wait_ready(gateway, "starting", None, timeout_s=0.5, progress=False)
