"""A real Prometheus scraping a running stack on the GPU path answers every Grafana dashboard query.

The stack: a GPU Manager (cpu back end, two units), a scheduler and the gateway sharing one state
folder as `make up` runs them, classify built and deployed with an SLO and invoked a few times;
the procurer (`--no-managers`, quick boots); and a second GPU Manager over fake NVML (an A100 in
MIG mode, tests/fake_nvml.py) served on real HTTP with the cluster token, sliced once, so that the
MIG panel has a reconfiguration to show (the cpu back end has no GPU to slice). Prometheus
(Debian's package) scrapes them all every second with deploy/prometheus/prometheus.yml's jobs and
the state folder's token file; then each query of deploy/grafana/faas-gpu.json, Grafana's variables
fixed, must return data through Prometheus's HTTP API.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import requests
from werkzeug.serving import make_server

from faas_gpu.credentials import ensure_token
from faas_gpu.models import ModelStore
from faas_gpu.ports import free_port
from gpu_manager.api import create_app
from gpu_manager.discovery import discover_units
from gpu_manager.manager import GPUManager
from tests.daemon_process import Daemon
from tests.e2e.classify_project import build_and_deploy, classify_stack, write_project
from tests.fake_nvml import FakeGPU, MigNVML
from tests.fake_worker import FakeWorker
from tests.prometheus import dashboard_queries, prometheus, query, require_prometheus, scrape_config, substitute
from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def mig_node(tmp_path):
    """A GPU Manager over a fake A100 sliced (4g, 3g), on real HTTP with the cluster `token`."""

    def start(token: str) -> str:
        a100 = FakeGPU.a100_40gb()
        nvml = MigNVML([a100])
        nvml.preset(a100, [("4g.20gb", 0), ("3g.20gb", 4)])
        gate = threading.Event()
        gate.set()
        manager = GPUManager(
            discover_units(nvml),
            ModelStore(tmp_path / "mig-models"),
            worker_factory=lambda a, d, env=None: FakeWorker(a, d, env, gate),
            nvml=nvml,
        )
        server = make_server("127.0.0.1", free_port(), create_app(manager, token), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append((manager, server))
        return f"127.0.0.1:{server.server_port}"

    started: list = []
    yield start
    for manager, server in started:
        server.shutdown()
        manager.close()


def test_prometheus_answers_every_dashboard_query_over_a_running_stack(tmp_path, mig_node):
    require_prometheus()
    home = tmp_path / ".faas-gpu"
    home.mkdir()
    write_project(tmp_path, classify_stack("e2e/classify-prom:latest", {"com.faas-gpu.slo-ms": "5000"}))
    manager = Daemon("gpu_manager", home, "--units", "2", "--unit-memory-mb", "64", "--node", "local")
    scheduler = Daemon("scheduler", home)
    procurer_port = free_port()
    procurer = subprocess.Popen(
        [sys.executable, "-m", "procurer", "--home", str(home), "--no-managers", "--nodes", "1", "--boot", "0.5"]
        + ["--period", "0.5", "--status-port", str(procurer_port)],
        stdout=open(home / "procurer.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack = StackProcess(home, "--scheduler", scheduler.url).start()
    try:
        token_file = home / "secrets" / "gpu-manager-token"
        mig = mig_node(ensure_token(home / "secrets"))
        build_and_deploy(tmp_path, home, stack.url)
        stack.wait_ready("classify", timeout_s=120)

        targets = {
            "gateway": [stack.metrics_url.removeprefix("http://")],
            "provider": [stack.provider_url.removeprefix("http://")],
            "scheduler": [scheduler.url.removeprefix("http://")],
            "gpu-manager": [manager.url.removeprefix("http://"), mig],
            "procurer": [f"127.0.0.1:{procurer_port}"],
        }
        with prometheus(scrape_config(targets, token_file), tmp_path / "prometheus") as prom:
            _wait(lambda: _all_up(prom, sum(len(t) for t in targets.values())), 60, "every target up")
            for _ in range(4):  # some before a second scrape, some after: counters seen rising
                answer = requests.post(f"{stack.url}/function/classify", json={"seed": 0}, timeout=120)
                assert answer.status_code == 200, answer.text
                assert answer.headers["X-Faas-Gpu-Unit"].startswith("cpu-")  # through the scheduler
                time.sleep(1)
            auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
            geometry = {"profiles": ["4g.20gb", "2g.10gb", "1g.5gb"]}
            r = requests.post(f"http://{mig}/v1/gpus/0/geometry", json=geometry, headers=auth, timeout=30)
            assert r.status_code == 200, r.text

            queries = dashboard_queries()
            empty: dict[str, str] = {}
            deadline = time.monotonic() + 30  # a few scrapes for the last counters and the reconfiguration
            for title, expr in queries:
                while not (result := query(prom, substitute(expr))) and time.monotonic() < deadline:
                    time.sleep(0.5)
                if not result:
                    empty[expr] = title
            assert not empty, f"{len(empty)} of {len(queries)} dashboard queries have no data: {empty}"

            # and the data is the stack's: the invocations, the SLO, the cache and the slicing
            fn = 'function_name="classify.openfaas-fn"'
            assert float(query(prom, f"sum(gateway_function_invocation_total{{{fn}}})")[0]["value"][1]) == 4
            # batches under a placement lease reach the scheduler's count within a second or so
            slo_jobs = 'sum(faas_gpu_slo_jobs_total{function="classify.openfaas-fn"})'
            _wait(lambda: float(query(prom, slo_jobs)[0]["value"][1]) == 4, 15, "every call in the SLO count")
            hits = query(prom, "sum(faas_gpu_model_cache_hits_total) + sum(faas_gpu_model_cache_misses_total)")
            assert float(hits[0]["value"][1]) == 4
            done = query(prom, 'faas_gpu_mig_reconfigurations_total{result="done"}')
            assert [float(s["value"][1]) for s in done] == [1.0]
    finally:  # Prometheus is stopped by its context manager
        stack.stop()
        procurer.terminate()
        procurer.wait(30)
        scheduler.kill()
        manager.kill()


def _all_up(prom: str, n: int) -> bool:
    up = query(prom, "up")
    return len(up) == n and all(s["value"][1] == "1" for s in up)


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
