"""The scheduler ignores unit reports its GPU Managers did not write.

A unit report names the URL the scheduler sends jobs to, with the cluster token as their bearer:
a forged one would hand an intruder every job and the token itself. Here a report written without
the cluster key, and a manager's genuine report moved and redirected (its MAC then fails), both
point at a listener of the test's: the scheduler daemon (real etcd, real HTTP) lists neither,
sends nothing there, and the real manager beside them keeps serving."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
import torch

from faas_gpu.contract import keys
from faas_gpu.contract.wire import encode
from faas_gpu.datastore import open_datastore
from tests.classify_model import scripted_resnet
from tests.daemon_process import wait_units


class _Intruder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def _any(self) -> None:
        _Intruder.seen.append((self.path, self.headers.get("Authorization", "")))
        self.send_response(200)
        self.end_headers()

    do_GET = do_PUT = do_POST = _any

    def log_message(self, *args) -> None:
        pass


def _report(node: str, unit: str, url: str) -> str:
    return json.dumps({"node": node, "unit": unit, "url": url, "memory_mb": 100000.0, "state": "idle", "models": []})


def test_tampered_and_forged_unit_reports_get_no_job_and_no_token(cluster, etcd_server):
    _Intruder.seen = []
    intruder = ThreadingHTTPServer(("127.0.0.1", 0), _Intruder)
    threading.Thread(target=intruder.serve_forever, daemon=True).start()
    evil = f"http://127.0.0.1:{intruder.server_port}"
    start, auth = cluster
    start("gpu_manager", "--node", "n1", "--units", "1", "--unit-memory-mb", "8")
    sched = start("scheduler", "--no-units-timeout", "3")
    wait_units(sched.url, auth, 1)
    raw = open_datastore(etcd_server.url)  # the daemons' etcd login, without the cluster key
    try:
        genuine = raw.get(keys.unit("n1", "cpu-0")).value
        assert genuine.startswith(b"faas-gpu:mac1:")
        raw.put(keys.unit("evil", "gpu-0"), _report("evil", "gpu-0", evil))  # no MAC
        moved = genuine.replace(b'"n1"', b'"evil2"').replace(b"http://127.0.0.1:", evil.encode() + b"#")
        raw.put(keys.unit("evil2", "cpu-0"), moved)  # a genuine MAC on changed bytes
        time.sleep(2)  # the scheduler reads the reports every round
        status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=10).json()
        assert status["units"] == ["n1/cpu-0"], status["units"]
        data, _ = scripted_resnet(1)
        digest = requests.put(f"{sched.url}/v1/models", data=data, headers=auth, timeout=30).json()["digest"]
        for _ in range(4):  # every job runs on the real unit; none goes to the forged ones
            r = requests.post(
                f"{sched.url}/v1/jobs/{digest}", data=encode(torch.randn(1, 3, 32, 32)), headers=auth, timeout=60
            )
            assert r.status_code == 200 and r.headers["X-Faas-Gpu-Unit"] == "cpu-0", r.text
        assert _Intruder.seen == []
        # the manager's own next report replaces a tampered copy of its key, as a redeploy would
        raw.put(keys.unit("n1", "cpu-0"), genuine.replace(b"http://127.0.0.1:", evil.encode() + b"#"))
        r = requests.post(
            f"{sched.url}/v1/jobs/{digest}", data=encode(torch.randn(1, 3, 32, 32)), headers=auth, timeout=60
        )
        assert r.status_code in (200, 503), r.text
        assert _Intruder.seen == []
    finally:
        for node in ("evil", "evil2"):
            raw.delete_prefix(f"{keys.UNITS}{node}/")
        raw.close()
        intruder.shutdown()
