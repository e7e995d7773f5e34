"""What the async tests share: a function deployed and ready, the gateway's count of its calls,
and a callback receiver on loopback that counts callbacks by X-Call-Id."""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from tests.stack_process import StackProcess

NS = "openfaas-fn"


def deploy(s: StackProcess, name: str, process: str = "cat") -> None:
    body = {"service": name, "image": f"functions/{name}:latest", "envProcess": process}
    r = requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=30)
    assert r.status_code == 202, r.text
    s.wait_ready(name)


def invocations(s: StackProcess, name: str) -> float:
    """Calls of `name` the gateway counted (sync and queued alike), from its /metrics."""
    text = requests.get(f"{s.url}/metrics", timeout=10).text
    pattern = rf'gateway_function_invocation_total\{{code="\d+",function_name="{name}\.{NS}"\}} (\S+)'
    return sum(float(v) for v in re.findall(pattern, text))


class Receiver:
    """An HTTP server on loopback that counts the callbacks it gets by X-Call-Id (`seen`)."""

    def __init__(self):
        self.seen: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    seen[self.headers.get("X-Call-Id", "")] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/cb"


@contextmanager
def receiving() -> Iterator[Receiver]:
    r = Receiver()
    threading.Thread(target=r.server.serve_forever, daemon=True).start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
