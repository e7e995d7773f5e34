"""faas-gpu on a three-host Docker Swarm (network namespaces on this machine), figures measured in
one run against baselines from the same run:

- `container_cold_start_s` / `process_cold_start_s`: deploy -> first 200 answer of the same
  function (the template's watchdog, streaming mode) as a Swarm service through `--runtime swarm`
  (image already on the node) and as a process through `--runtime local`, both gateways on the
  swarm manager;
- `container_hop_overhead_ratio`: p50 latency through the gateway to the container replica / to
  the process replica (same function, same host: the container is constrained to the manager node,
  so the ratio is the container's cost, not the veth hop's), interleaved;
- `cluster_throughput_x`: a model through the GPU path (client -> scheduler -> GPU Managers on
  the `sim` back end, whose units take INFless's profiled ResNet-50 time without using this
  machine's cores): closed-loop throughput with GPU Managers on 2 GPU hosts / on 1;
- `node_loss_lost_requests`: calls through the gateway to a function with replicas on both
  workers while one worker is lost (its GPU Manager killed, its dockerd stopped): the calls not
  answered 200.
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import io
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e.swarm_hosts import GATEWAY, PYTHON, REGISTRY, SCHEDULER, Cluster, ClusterStack, watchdog_image  # noqa: E402

PROFILE = REPO.parent / "shared" / "data" / "infless" / "profiler" / "resnet-50-profile-results.txt"
LOCAL_GATEWAY = "http://10.77.0.1:8180"


def _deploy(m, gateway: str, auth, body: dict) -> None:
    r = m.call(lambda: requests.post(f"{gateway}/system/functions", json=body, auth=auth, timeout=60))
    assert r.status_code in (200, 202), r.text


def _first_answer(m, url: str, timeout_s: float = 120) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if m.call(lambda: requests.post(url, data=b"x", timeout=30)).status_code == 200:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url}: no answer in {timeout_s} s")


def _p50(m, url: str, n: int) -> float:
    def run() -> float:
        s = requests.Session()
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert s.post(url, data=b"ping", timeout=30).status_code == 200
            lat.append(time.perf_counter() - t0)
        return statistics.median(lat)

    return m.call(run)


def _local_gateway(cluster: Cluster, stack: ClusterStack) -> tuple[str, str]:
    home = cluster.root / "local-provider"
    m = cluster.manager
    m.popen(
        [
            PYTHON,
            "-m",
            "provider.server",
            "--home",
            str(home),
            "--bind",
            "0.0.0.0",
            "--gateway-port",
            "8180",
            "--provider-port",
            "8181",
            "--metrics-port",
            "0",
        ],
        cluster.root / "local-provider.log",
        env={**os.environ, "PYTHONPATH": str(REPO), "FAAS_GPU_HOME": str(home)},
        cwd=REPO,
    )
    from tests.e2e.swarm_hosts import _wait_http

    _wait_http(m, f"{LOCAL_GATEWAY}/healthz", cluster.root / "local-provider.log")
    s = home / "secrets"
    return (s / "basic-auth-user").read_text().strip(), (s / "basic-auth-password").read_text().strip()


def cold_and_hop(cluster: Cluster, stack: ClusterStack, n: int) -> dict:
    m = cluster.manager
    local_auth = _local_gateway(cluster, stack)
    env = {"mode": "streaming"}
    _deploy(
        m,
        GATEWAY,
        stack.auth,
        {"service": "echoc", "image": f"{REGISTRY}/echo:latest", "envVars": env, "constraints": ["node.role==manager"]},
    )
    container_cold = _first_answer(m, f"{GATEWAY}/function/echoc")
    _deploy(
        m, LOCAL_GATEWAY, local_auth, {"service": "echop", "image": "echo:none", "envProcess": "cat", "envVars": env}
    )
    process_cold = _first_answer(m, f"{LOCAL_GATEWAY}/function/echop")
    c, p = [], []
    for _ in range(3):  # interleaved rounds
        c.append(_p50(m, f"{GATEWAY}/function/echoc", n))
        p.append(_p50(m, f"{LOCAL_GATEWAY}/function/echop", n))
    return {
        "container_cold_start_s": round(container_cold, 2),
        "process_cold_start_s": round(process_cold, 2),
        "container_p50_ms": round(statistics.median(c) * 1000, 2),
        "process_p50_ms": round(statistics.median(p) * 1000, 2),
        "container_hop_overhead_ratio": round(statistics.median(c) / statistics.median(p), 3),
    }


def node_loss(cluster: Cluster, stack: ClusterStack, seconds: float) -> dict:
    m, lost = cluster.manager, cluster.workers[1]
    _deploy(
        m,
        GATEWAY,
        stack.auth,
        {
            "service": "echol",
            "image": f"{REGISTRY}/echo:latest",
            "envVars": {"mode": "streaming"},
            "constraints": ["node.labels.gpu==true"],
            "labels": {"com.openfaas.scale.min": "2"},
        },
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = m.call(lambda: requests.get(f"{GATEWAY}/system/function/echol", auth=stack.auth, timeout=5)).json()
        if st.get("availableReplicas", 0) >= 2:
            break
        time.sleep(0.3)
    stop = time.monotonic() + seconds
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def caller() -> None:
        s = requests.Session()
        while time.monotonic() < stop:
            try:
                code = s.post(f"{GATEWAY}/function/echol", data=b"x", timeout=60).status_code
            except requests.RequestException as exc:
                code = type(exc).__name__
            with lock:
                outcomes[code] += 1

    with cf.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(m.call, caller) for _ in range(4)]
        time.sleep(seconds / 4)
        stack.kill_manager(lost)
        lost.stop_dockerd()
        for f in futs:
            f.result()
    total = sum(outcomes.values())
    return {
        "node_loss_requests": total,
        "node_loss_lost_requests": total - outcomes[200],
        "node_loss_outcomes": {str(k): v for k, v in outcomes.items()},
        "units_after_loss": stack.scheduler_units(),
    }


def _sim_rps(m, token: str, callers: int, seconds: float) -> float:
    def run() -> float:
        import torch

        from faas_gpu import client

        os.environ.update(
            FAAS_GPU_SCHEDULER_URL=SCHEDULER,
            FAAS_GPU_TOKEN=token,
            FAAS_GPU_MAX_BATCH="16",
            FAAS_GPU_BATCH_TIMEOUT_MS="20",
        )
        remote = client.remote(torch.nn.Linear(4, 4))
        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(torch.nn.Linear(4, 4)), buf)
        remote._artifact = buf.getvalue()  # the sim back end runs no model: any accepted artifact does
        remote(torch.zeros(1, 3, 32, 32))
        done = [0]
        lock = threading.Lock()
        stop = time.perf_counter() + seconds

        def caller() -> None:
            x = torch.zeros(1, 3, 32, 32)
            while time.perf_counter() < stop:
                remote(x)
                with lock:
                    done[0] += 1

        threads = [
            threading.Thread(target=caller) for _ in range(callers)
        ]  # made here: they inherit this thread's netns
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return done[0] / (time.perf_counter() - t0)

    return m.call(run)


def cluster_throughput(seconds: float, callers: int) -> dict:
    sim = ("--sim-profile", str(PROFILE), "--sim-threads", "8", "--sim-sm", "50", "--sim-load-s", "0.1")
    cluster = Cluster()
    try:
        stack = ClusterStack(cluster, backend="sim", units=1, manager_args=sim, workers=cluster.workers[:1])
        _wait_units(stack, 1)
        one = _sim_rps(cluster.manager, stack.token, callers, seconds)
        stack.start_manager(cluster.workers[1], "sim", 1, sim)
        _wait_units(stack, 2)
        two = _sim_rps(cluster.manager, stack.token, callers, seconds)
    finally:
        cluster.stop()
    return {"sim_1host_rps": round(one, 1), "sim_2host_rps": round(two, 1), "cluster_throughput_x": round(two / one, 3)}


def _wait_units(stack: ClusterStack, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(stack.scheduler_units()) < n:
        assert time.monotonic() < deadline, stack.scheduler_units()
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="calls per p50 round")
    p.add_argument("--seconds", type=float, default=8.0, help="each throughput and node-loss window")
    p.add_argument("--callers", type=int, default=32)
    a = p.parse_args(argv)
    figures: dict = {}
    cluster = Cluster()
    try:
        watchdog_image(cluster.manager, f"{REGISTRY}/echo:latest")
        cluster.manager.docker("push", f"{REGISTRY}/echo:latest")
        stack = ClusterStack(cluster)
        figures.update(cold_and_hop(cluster, stack, a.requests))
        figures.update(node_loss(cluster, stack, a.seconds * 2))
    finally:
        cluster.stop()
    figures.update(cluster_throughput(a.seconds, a.callers))
    print(
        f"cold start: container {figures['container_cold_start_s']} s vs process {figures['process_cold_start_s']} s; "
        f"hop p50 {figures['container_p50_ms']} ms vs {figures['process_p50_ms']} ms -> "
        f"x{figures['container_hop_overhead_ratio']} (goal <= 1.10); 2 vs 1 GPU hosts (sim) "
        f"x{figures['cluster_throughput_x']} (goal >= 1.8); node loss: {figures['node_loss_lost_requests']} of "
        f"{figures['node_loss_requests']} calls not answered 200 ({figures['node_loss_outcomes']})",
        file=sys.stderr,
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
