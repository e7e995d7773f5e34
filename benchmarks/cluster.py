"""faas-gpu on a three-host Docker Swarm (tests/docker_hosts.py: network namespaces on this machine,
a dockerd each, manager + 2 gpu=true workers, a registry on the manager), figures measured in one
run against baselines from the same run. Function images are real: the python3-gpu template's
Dockerfile on faas-gpu/base (`faas-gpu build --docker --push`), pulled by the nodes.

- `container_cold_start_s` / `process_cold_start_s`: deploy -> first 200 answer of the same
  function (`echo`, the template's watchdog and index.py over a tiny handler) as a Swarm service
  through `--runtime swarm` (image already on the node) and as a process through `--runtime
  local` (`faas-gpu build` into that gateway's image store), both gateways on the swarm manager;
- `container_hop_overhead_ratio`: p50 latency through the gateway to the container replica / to
  the process replica (same image contents, same watchdog, same host: the service is constrained
  to the manager node, so the ratio is the container's cost, not the veth hop's), interleaved
  rounds; `direct_*_p50_ms` call each replica's watchdog without the gateway, to tell the
  gateway's part from the replica's;
- `cluster_throughput_x`: a model through the GPU path (client -> scheduler -> GPU Managers on
  the `sim` back end, whose units take INFless's profiled ResNet-50 time without using this
  machine's cores): closed-loop throughput with GPU Managers on 2 GPU hosts / on 1, the load from
  several client processes in the manager's namespace (`--client-procs` x `--callers` threads);
- `node_loss_lost_requests`: calls to classify (replicas on both workers, GPU Managers a global
  service there) while one worker is lost (its dockerd stopped): the calls not answered 200.
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROFILE = REPO.parent / "shared" / "data" / "infless" / "profiler" / "resnet-50-profile-results.txt"
LOCAL_GATEWAY = "http://10.77.0.1:8180"
ECHO = 'def handle(event, context):\n    """The body back: the hop\'s cost, no work."""\n    return event.body\n'


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _swarm():
    """The tests' swarm3: manager + 2 gpu=true workers, faas-gpu/base of this checkout on every
    host through the manager's registry (seeded from ~/.cache/faas-gpu, as the fixture does)."""
    from tests.docker_hosts import make_swarm, provision_base, registry_seed

    swarm = make_swarm(2, registry_seed=registry_seed(), log=_log)
    try:
        swarm.base_image = provision_base(swarm, log=_log)  # type: ignore[attr-defined]
    except BaseException:
        swarm.stop()
        raise
    return swarm


def _project(root: Path, name: str, image: str, **fn: object) -> Path:
    from tests.e2e.classify_project import classify_stack, write_project

    root.mkdir(parents=True, exist_ok=True)
    if name == "classify":
        # an SLO these shared cores meet: a 504 would be the scheduler's SLO miss, not a lost call;
        # a short batch timeout, or batches wait a quarter of that SLO (15 s) for callers to fill them
        stack = classify_stack(image, {"com.faas-gpu.slo-ms": "60000", "com.faas-gpu.batch-timeout-ms": "20"})
        stack["functions"]["classify"].update(fn)
        write_project(root, stack)
    else:
        (root / name).mkdir(exist_ok=True)
        (root / name / "handler.py").write_text(ECHO)
        (root / name / "requirements.txt").write_text("")
        spec = {"lang": "python3-gpu", "handler": f"./{name}", "image": image, **fn}
        stack = {"version": 1.0, "provider": {"name": "openfaas"}, "functions": {name: spec}}
        (root / "stack.yml").write_text(yaml.safe_dump(stack))
    return root


def _deploy(m, gateway: str, auth, body: dict) -> None:
    r = m.call(requests.post, f"{gateway}/system/functions", json=body, auth=auth, timeout=60)
    assert r.status_code in (200, 202), r.text


def _first_answer(m, url: str, t0: float, timeout_s: float = 180) -> float:
    def run() -> float:
        s = requests.Session()
        while time.monotonic() - t0 < timeout_s:
            try:
                if s.post(url, data=b"x", timeout=30).status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{url}: no answer in {timeout_s} s")

    return m.call(run)


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


def _local_gateway(swarm, root: Path) -> tuple[Path, tuple[str, str], list[subprocess.Popen]]:
    """A second gateway on the manager with `--runtime local`, set up as the swarm one is (its own
    etcd, the same scheduler and in-flight limit), so the two hops differ only in what runs the
    replica."""
    from tests.e2e.cluster_stack import PYTHON, SCHEDULER, wait_http

    home = root / "local-provider"
    etcd = "http://10.77.0.1:2479"
    procs = []
    for name, argv in (
        ("local-etcd", ["etcd", "--data-dir", str(root / "local-etcd"), "--listen-client-urls", etcd,
                        "--advertise-client-urls", etcd, "--listen-peer-urls", "http://10.77.0.1:2480"]),
        ("local-provider", [PYTHON, "-m", "provider.server", "--home", str(home), "--bind", "0.0.0.0",
                            "--gateway-port", "8180", "--provider-port", "8181", "--metrics-port", "0",
                            "--runtime", "local", "--etcd", etcd, "--scheduler", SCHEDULER,
                            "--max-inflight-per-function", "64"]),
    ):  # fmt: skip
        log = root / f"{name}.log"
        with open(log, "ab") as out:
            procs.append(swarm.manager.popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), "FAAS_GPU_HOME": str(home)},
            ))  # fmt: skip
        wait_http(swarm.manager, f"{etcd}/health" if name == "local-etcd" else f"{LOCAL_GATEWAY}/healthz", log)
    s = home / "secrets"
    return home, ((s / "basic-auth-user").read_text().strip(), (s / "basic-auth-password").read_text().strip()), procs


def _cli(swarm, home: Path, cwd: Path, *args: str) -> None:
    from tests.e2e.cluster_stack import PYTHON

    done = swarm.manager.run(
        [PYTHON, "-m", "faas_gpu.cli", *args], check=False, cwd=cwd, timeout=900,
        env={**os.environ, "FAAS_GPU_HOME": str(home), "PYTHONPATH": str(REPO), "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])


def _replica_url(name: str) -> str | None:
    """A replica's own watchdog URL: the process (or container process: a host-network container
    is a process of this machine too) whose env names the function, at its `port`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = dict(
                kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv
            )
        except (OSError, UnicodeDecodeError):
            continue
        if env.get("FAAS_GPU_FUNCTION") == name and env.get("port"):
            return f"http://127.0.0.1:{env['port']}"
    return None


def cold_and_hop(swarm, stack, root: Path, n: int) -> dict:
    from tests.docker_hosts import REGISTRY
    from tests.e2e.cluster_stack import BASE_IMAGE, GATEWAY

    m = swarm.manager
    image = f"{REGISTRY}/echo:latest"
    project = _project(root / "echo", "echo", image)
    _cli(swarm, stack.home, project, "build", "-f", "stack.yml", "--docker", "--push", "--docker-host", m.base_url,
         "--build-arg", f"BASE_IMAGE={BASE_IMAGE}")  # fmt: skip
    home, local_auth, procs = _local_gateway(swarm, root)
    try:
        _cli(swarm, home, project, "build", "-f", "stack.yml")  # the process runtime's image store
        t0 = time.monotonic()
        _deploy(m, GATEWAY, stack.auth, {"service": "echoc", "image": image, "constraints": ["node.role==manager"]})
        container_cold = _first_answer(m, f"{GATEWAY}/function/echoc", t0)
        t0 = time.monotonic()
        _deploy(m, LOCAL_GATEWAY, local_auth, {"service": "echop", "image": image})
        process_cold = _first_answer(m, f"{LOCAL_GATEWAY}/function/echop", t0)
        c, p = [], []
        for _ in range(3):  # interleaved rounds
            c.append(_p50(m, f"{GATEWAY}/function/echoc", n))
            p.append(_p50(m, f"{LOCAL_GATEWAY}/function/echop", n))
        # each replica's own watchdog, without the gateway: is the difference the replica's?
        direct = {}
        for key, name in (("container", "echoc"), ("process", "echop")):
            url = _replica_url(name)
            if url:
                direct[f"direct_{key}_p50_ms"] = round(statistics.median(_p50(m, url, n) for _ in range(2)) * 1000, 2)
    finally:
        for proc in procs:
            with contextlib.suppress(Exception):
                os.killpg(proc.pid, 9)
    return {
        "container_cold_start_s": round(container_cold, 2),
        "process_cold_start_s": round(process_cold, 2),
        "container_p50_ms": round(statistics.median(c) * 1000, 2),
        "process_p50_ms": round(statistics.median(p) * 1000, 2),
        "container_hop_overhead_ratio": round(statistics.median(c) / statistics.median(p), 3),
        **direct,
    }


def node_loss(swarm, stack, root: Path, seconds: float) -> dict:
    from tests.docker_hosts import REGISTRY
    from tests.e2e.cluster_stack import GATEWAY, build_classify

    m, lost = swarm.manager, swarm.workers[1]
    project = _project(
        root / "classify",
        "classify",
        f"{REGISTRY}/classify:latest",
        constraints=["node.labels.gpu==true"],
        labels={"com.openfaas.scale.min": "2"},
        # the first call exports, uploads and loads the model: more than the watchdog's 30 s here
        environment={"exec_timeout": "120s", "read_timeout": "120s", "write_timeout": "120s"},
    )
    build_classify(swarm, project, stack.home)
    _cli(swarm, stack.home, project, "deploy", "-f", "stack.yml", "--gateway", GATEWAY)
    stack.wait_available("classify", 2, timeout_s=300)
    placed = sorted(stack.function_hosts("classify").values())
    first = m.call(requests.post, f"{GATEWAY}/function/classify", json={"seed": 1}, timeout=120)
    assert first.status_code == 200, first.text
    outcomes = stack.calls_through_node_loss(lost, seconds=seconds, lose_after_s=seconds / 4)
    total = sum(outcomes.values())
    stack.wait_units_gone(lost)
    return {
        "node_loss_placed_on": placed,
        "node_loss_requests": total,
        "node_loss_lost_requests": total - outcomes[200],
        "node_loss_outcomes": {str(k): v for k, v in outcomes.items()},
        "units_after_loss": stack.scheduler_units(),
        "node_loss_calls": stack.call_log,  # (sent at s into the window, took s, outcome)
    }


# -- throughput: GPU Managers on the sim back end, 1 host vs 2 ----------------------------------
def load_client(token: str, scheduler: str, callers: int, seconds: float) -> None:
    """One load process (in the manager's namespace): `callers` threads calling a model through
    the GPU client for `seconds`, started when a line comes on stdin; prints the calls done."""
    import io

    import torch

    from benchmarks.closed_loop import closed_loop
    from faas_gpu import client

    os.environ.update(FAAS_GPU_SCHEDULER_URL=scheduler, FAAS_GPU_TOKEN=token, FAAS_GPU_MAX_BATCH="16",
                      FAAS_GPU_BATCH_TIMEOUT_MS="20")  # fmt: skip
    torch.set_num_threads(1)
    remote = client.remote(torch.nn.Linear(4, 4))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 4)), buf)
    remote._artifact = buf.getvalue()  # the sim back end runs no model: any accepted artifact does
    remote(torch.zeros(1, 3, 32, 32))
    print("ready", flush=True)
    sys.stdin.readline()  # every load process starts together
    t0 = time.perf_counter()
    _rps, lat = closed_loop(functools.partial(remote, torch.zeros(1, 3, 32, 32)), callers, seconds)
    print(json.dumps({"calls": len(lat), "s": time.perf_counter() - t0}), flush=True)


def _sim_rps(swarm, token: str, procs: int, callers: int, seconds: float) -> float:
    from tests.e2e.cluster_stack import PYTHON, SCHEDULER

    argv = [PYTHON, str(Path(__file__).resolve()), "--load-client", token, SCHEDULER, str(callers), str(seconds)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    clients = [
        swarm.manager.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
        for _ in range(procs)
    ]
    try:
        for c in clients:
            assert c.stdout.readline().strip() == "ready"
        for c in clients:
            c.stdin.write("go\n")
            c.stdin.flush()
        results = [json.loads(c.stdout.readline()) for c in clients]
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                c.kill()
                c.wait(10)
    return sum(r["calls"] for r in results) / max(r["s"] for r in results)


def cluster_throughput(swarm, seconds: float, procs: int, callers: int) -> dict:
    from tests.e2e.cluster_stack import ClusterStack

    sim = ("--sim-profile", str(PROFILE), "--sim-threads", "8", "--sim-sm", "50", "--sim-load-s", "0.1")
    stack = ClusterStack(swarm, backend="sim", units=1, manager_args=sim, manager_mode="process",
                         manager_hosts=swarm.workers[:1])  # fmt: skip
    try:
        _wait_units(stack, 1)
        one = _sim_rps(swarm, stack.token, procs, callers, seconds)
        stack.start_manager_process(swarm.workers[1])
        _wait_units(stack, 2)
        two = _sim_rps(swarm, stack.token, procs, callers, seconds)
        more = _sim_rps(swarm, stack.token, procs * 2, callers, seconds)  # where it saturates
    finally:
        stack.stop()
    return {
        "sim_1host_rps": round(one, 1),
        "sim_2host_rps": round(two, 1),
        "sim_2host_rps_2x_clients": round(more, 1),
        "cluster_throughput_x": round(two / one, 3),
    }


def _wait_units(stack, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(stack.scheduler_units()) < n:
        assert time.monotonic() < deadline, stack.scheduler_units()
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--load-client"]:
        load_client(args[1], args[2], int(args[3]), float(args[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="calls per p50 round")
    p.add_argument("--seconds", type=float, default=8.0, help="each throughput window (node loss: 3x)")
    p.add_argument("--client-procs", type=int, default=4, help="load processes for the throughput figure")
    p.add_argument(
        "--callers",
        type=int,
        default=16,
        help="threads per load process (64 in all: enough calls in flight to keep two units' batches of 16 full)",
    )
    p.add_argument("--only", choices=["hop", "loss", "throughput"], action="append")
    a = p.parse_args(args)
    from tests.e2e.cluster_stack import GPU_MANAGER_SERVICE, ClusterStack

    only = set(a.only or ["hop", "loss", "throughput"])
    figures: dict = {}
    swarm = _swarm()
    root = Path(tempfile.mkdtemp(prefix="fgb-"))
    try:
        if only & {"hop", "loss"}:
            stack = ClusterStack(swarm)  # GPU Managers: the global service on the gpu workers
            try:
                if "hop" in only:
                    figures.update(cold_and_hop(swarm, stack, root, a.requests))
                    _log(f"[cluster] {json.dumps(figures)}")
                if "loss" in only:
                    try:
                        figures.update(node_loss(swarm, stack, root, a.seconds * 3))
                    except Exception as exc:  # the other figures still count; say what failed
                        figures["node_loss_error"] = str(exc)[:500]
                        _log(f"[cluster] node loss failed: {exc}\n{stack.diagnose()}")
            finally:
                stack.stop()
            for w in swarm.workers:
                if w._client is None:
                    w.start()  # the lost worker back, for the 2-host figure
            swarm.manager.client.services.get(GPU_MANAGER_SERVICE).remove()
            for svc in swarm.manager.client.services.list():
                svc.remove()
        if "throughput" in only:
            figures.update(cluster_throughput(swarm, a.seconds, a.client_procs, a.callers))
    finally:
        swarm.stop()
        shutil.rmtree(root, ignore_errors=True)
    if "container_hop_overhead_ratio" in figures:
        f = figures
        _log(
            f"cold start: container {f['container_cold_start_s']} s vs process {f['process_cold_start_s']} s "
            f"(goal <= 2 s apart); hop p50 {f['container_p50_ms']} ms vs {f['process_p50_ms']} ms -> "
            f"x{f['container_hop_overhead_ratio']} (goal <= 1.10)"
        )
    if "cluster_throughput_x" in figures:
        _log(
            f"2 vs 1 GPU hosts (sim): {figures['sim_2host_rps']} / {figures['sim_1host_rps']} calls/s -> "
            f"x{figures['cluster_throughput_x']} (goal >= 1.8)"
        )
    if "node_loss_lost_requests" in figures:
        _log(
            f"node loss: {figures['node_loss_lost_requests']} of {figures['node_loss_requests']} calls not "
            f"answered 200 ({figures['node_loss_outcomes']}; goal 0)"
        )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
