"""benchmarks/path_limit.py's callers against a real HTTP server on loopback: every answer is
counted once, by status or by error, a connection the server closes is opened again, and the
batch size the stack reports is read from its header. The benchmark's ratios rest on these
counts; its timings are its own business (no timing is asserted here)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from faas_gpu.paths import REPO_ROOT
from tests.module_files import load


@pytest.fixture(scope="module")
def bench():
    return load("path_limit", REPO_ROOT / "benchmarks" / "path_limit.py")


class _Handler(BaseHTTPRequestHandler):
    """Odd seeds: 503. Even ones: 200 with batch 4. Every third answer closes its connection."""

    protocol_version = "HTTP/1.1"
    seen: list[int] = []
    lock = threading.Lock()

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_POST(self):  # noqa: N802
        seed = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["seed"]
        with self.lock:
            self.seen.append(seed)
            close = len(self.seen) % 3 == 0
        body = b'{"class": 2}'
        self.send_response(200 if seed % 2 == 0 else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Faas-Gpu-Batch", "4")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    _Handler.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/function/classify"
    srv.shutdown()
    srv.server_close()


def test_closed_loop_counts_every_answer_by_status_and_reads_the_batch(bench, server):
    r = bench.closed_loop(server, 3, 0.5)
    seen = _Handler.seen
    assert r["answered"] == len(seen) > 0
    odd = sum(1 for s in seen if s % 2)
    assert r["errors"] == ({503: odd} if odd else {})
    assert r["mean_batch"] == 4.0  # the 200s' X-Faas-Gpu-Batch


def test_closed_loop_counts_a_refused_connection_as_an_error_not_an_answer(bench):
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as srv:
        port = srv.server_address[1]
    r = bench.closed_loop(f"http://127.0.0.1:{port}/function/classify", 2, 0.2)  # nothing listens now
    assert r["rps"] == 0
    assert r["answered"] == 0  # no answer the stack would have spent CPU on
    assert set(r["errors"]) == {"ConnectionRefusedError"} and r["errors"]["ConnectionRefusedError"] > 0


def test_open_loop_answers_every_call_it_sent_and_counts_only_200s_within_the_slo(bench, server):
    r = bench.open_loop(server, 40, 0.5)
    assert r["sent"] == len(_Handler.seen) == sum(r["answers"].values()) > 0
    ok = r["answers"].get(200, 0)
    assert r["answers"].get(503, 0) == r["sent"] - ok
    assert r["slo_pct"] <= 100.0 * ok / r["sent"]  # a 503 is never within the SLO
