"""The serving path against the physical limit: classify's ResNetMini in-process vs through faas-gpu.

Measured in one run on this machine, same model and weights (functions/classify, ResNetMini, one
torch thread), same JSON requests (`{"seed": n}`):
- in-process: the model called at batch 1 and at its best batch, as written and as the GPU
  Manager's workers run it (its torch.export program rewritten for inference by
  `gpu_manager.optimize`, conv-bn folded, channels-last, conv + relu fused): the faster of the
  two at its best batch is the physical limit here;
- the whole faas-gpu path (gateway, watchdog, handler + client, scheduler, GPU Manager on the
  cpu back end, worker) for the classify function sized by INFless (SLO 250 ms), twice:
  * before: INFless predicting from the model's time alone (no path cost in the store): 8 clients
    closed loop (for its CPU a request), 32 clients closed loop, then an open loop at that maximum
    (today's: the path at batch 1, its watchdog proxying to index.py's own server as the template
    did before `mode=inproc`);
  * after: `faas-gpu profile --path classify` measures the path's fixed + per-request cost, the
    function is deployed again, and the planner counts it (and corrects itself by what it
    observes): 1 / 8 / 32 clients closed loop (each after a warm-up that lets the autoscaler
    re-plan), an open loop at 50 / 80 / 100% of the after maximum, and one at the before maximum;
- the stack started with `--pin-cpus` (the gateway and the function's replica kept on the first
  CPU, the GPU Manager and its worker free; `--pin-cpus none` leaves them all free): each of those
  Python processes hands its interpreter lock between threads on one CPU (`provider.runtime.pins`);
- CPU per request across every process of the stack (provider + replicas, scheduler, GPU
  Manager + workers: utime + stime from /proc) at 8 clients (and at 32), and that figure less
  the model's own CPU an image at batch 8 in process (`path_cpu_ms_per_request_batch8`): the
  model's share differs by machine (0.41 ms at batch 8 on the issue's, ~1 ms on a slower one);
  and today's CPU a request at 8 clients in the same run, before over after
  (`cpu_before_over_after_8_clients`: the issue asked 7.6 -> 2 ms on its machine, 3.8x);
- Ray Serve serving the same model with `@serve.batch` at the batch size INFless planned for 32
  clients (`max_ongoing_requests` raised to 64 from its default 5) at 32 clients, only when
  `ray[serve]` is importable (the `bench` extra, never a runtime dependency): `path_vs_ray_serve`.

Every closed and open loop, faas-gpu's and Ray Serve's, calls from threads of this process over
kept-alive `faas_gpu.http1` connections, light enough (~0.15 ms of CPU a request) that the callers
leave the machine's two cores to what they measure; their own CPU a request is printed beside the
stack's, never counted in it.

Prints the figures and ratios; the last line is one JSON object. The machine is shared: treat the
absolute figures as this run's, the ratios as the result.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import requests
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "functions" / "classify"))

from make_weights import generate  # noqa: E402
from model import ResNetMini  # noqa: E402

from faas_gpu.http1 import Connection, ProtocolError, ThreadConnections  # noqa: E402
from faas_gpu.saving import export_program  # noqa: E402
from gpu_manager import optimize  # noqa: E402
from tests.daemon_process import Daemon  # noqa: E402
from tests.stack_process import StackProcess  # noqa: E402

SLO_S = 0.25
IMAGE = (3, 32, 32)
JSON = {"Content-Type": "application/json"}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


# -- in-process ---------------------------------------------------------------------------------
def in_process(seconds: float) -> dict[str, dict[int, float]]:
    """Images per second at each batch size, one torch thread, the classify weights: the model as
    written (`plain`), and as the GPU Manager's workers run it (`served`: its torch.export
    program with the same inference rewrites, `gpu_manager.optimize`)."""
    torch.set_num_threads(1)
    net = ResNetMini()
    net.load_state_dict(generate())
    net.eval()
    # the artifact an instance uploads (`export_program`), loaded and rewritten as a worker does
    program = torch.export.load(io.BytesIO(export_program(net, torch.randn(1, *IMAGE))))
    served = program.module(check_guards=False)
    done = optimize.for_inference(served, tuple(program.example_inputs[0]), "cpu")
    print(f"in process, as the workers run it: {done.applied or done.skipped}")
    out: dict[str, dict[int, float]] = {}
    with torch.inference_mode():
        for name, model in (("plain", net), ("served", served)):
            out[name] = {}
            for b in (1, 2, 4, 8, 16, 32):
                x = torch.randn(b, *IMAGE)
                model(x)
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    model(x)
                    n += 1
                out[name][b] = n * b / (time.perf_counter() - t0)
    return out


# -- load ----------------------------------------------------------------------------------------
# The callers share this 2-core machine with what they measure, so they are kept light: one
# kept-alive `faas_gpu.http1` connection a thread (~0.15 ms of CPU a request here), not a
# `requests` session (~1.0-1.6 ms, as much as half of the stack's own CPU a request, which took
# cores from the path and held back its throughput, and Ray Serve's, in every closed loop).
def _post(conn: Connection, path: str, n: int) -> tuple[int | str, str | None]:
    """One call on a kept-alive connection: (status or error name, X-Faas-Gpu-Batch)."""
    body = json.dumps({"seed": n % 1000}).encode()
    try:
        answer = conn.request("POST", path, JSON, body)
    except (OSError, ProtocolError) as exc:  # the next call connects again
        conn.close()
        return type(exc).__name__, None
    if answer.will_close:
        conn.close()
    return answer.status, answer.header("X-Faas-Gpu-Batch")


def closed_loop(url: str, clients: int, seconds: float) -> dict:
    lat: list[float] = []
    batches: list[int] = []
    bad: list[int | str] = []
    lock = threading.Lock()
    parts = urlsplit(url)
    stop = time.monotonic() + seconds

    def one(i: int) -> None:
        conn = Connection(parts.hostname or "", parts.port or 80, timeout=60)
        n = i * 1_000_000
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            code, batch = _post(conn, parts.path, n)
            dt = time.perf_counter() - t0
            n += 1
            with lock:
                if code == 200:
                    lat.append(dt)
                    batches.append(int(batch or 1))
                else:
                    bad.append(code)
        conn.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return {
        "rps": len(lat) / elapsed,
        # every HTTP answer over `elapsed`, which the CPU readings around it span (a call that
        # failed on this side, e.g. refused, is an error, not an answer the stack spent CPU on)
        "answered": len(lat) + sum(1 for code in bad if isinstance(code, int)),
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "mean_batch": statistics.fmean(batches) if batches else 0.0,
        "errors": dict(Counter(bad)),
    }


def open_loop(url: str, rps: float, seconds: float) -> dict:
    """Requests start at `rps` whatever the answers take; within-SLO share of all sent, each
    call's latency counted from when it was due, so a caller late to start it counts against it."""
    lat: list[float] = []
    lock = threading.Lock()
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    conns = ThreadConnections(kept=1)
    codes: Counter = Counter()

    def one(n: int, due: float) -> None:
        conn, _ = conns.get(base, 30)
        code, _ = _post(conn, parts.path, n)
        dt = time.monotonic() - due
        with lock:
            codes[code] += 1
            lat.append(dt if code == 200 else float("inf"))

    n = 0
    with ThreadPoolExecutor(max_workers=512) as pool:
        start = time.monotonic()
        while (now := time.monotonic()) - start < seconds:
            due = start + n / rps
            if due > now:
                time.sleep(due - now)
            pool.submit(one, n, due)
            n += 1
    within = sum(1 for x in lat if x <= SLO_S)
    return {
        "offered_rps": rps,
        "sent": n,
        "slo_pct": 100.0 * within / max(1, n),
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "answers": dict(codes),
    }


# -- CPU across the stack -----------------------------------------------------------------------
def _tree(roots: list[int]) -> list[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                parent[int(d)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def cpu_ticks(roots: list[int]) -> dict[int, int]:
    """utime + stime (ticks) of every process under `roots`, by pid."""
    out = {}
    for p in _tree(roots):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            out[p] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return out


ROLES = (
    ("index.py", "handler"),
    ("fwatchdog", "watchdog"),
    ("provider.server", "gateway"),
    ("-m scheduler", "scheduler"),
    ("-m gpu_manager", "gpu_manager"),
)
"""How a process's command line names its part of the path (first match); others inherit their parent's."""


def roles(roots: list[int]) -> dict[int, str]:
    """Each process under `roots` by its part of the path (a worker is its GPU Manager's `…/child`)."""
    out: dict[int, str] = {}
    for p in _tree(roots):  # parents before their children
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        named = next((role for key, role in ROLES if key in cmd), None)
        out[p] = named or (f"{out[parent].split('/')[0]}/child" if parent in out else "other")
    return out


def cpu_ms_by_role(start: dict[int, int], end: dict[int, int], names: dict[int, str], requests: float) -> dict:
    """CPU ms per request of each part of the path between two `cpu_ticks` readings."""
    by: Counter[str] = Counter()
    for p, t in end.items():
        by[names.get(p, "other")] += max(0, t - start.get(p, 0))
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    return {role: round(ticks * tick_ms / max(1.0, requests), 2) for role, ticks in sorted(by.items())}


def cpu_seconds_between(start: dict[int, int], end: dict[int, int]) -> float:
    """CPU seconds spent between two `cpu_ticks` readings (a process that ended in between is missed)."""
    return sum(t - start.get(p, 0) for p, t in end.items() if t >= start.get(p, 0)) / os.sysconf("SC_CLK_TCK")


# -- the stack -----------------------------------------------------------------------------------
def with_cpu(url: str, clients: int, seconds: float, roots: list[int]) -> dict:
    """`closed_loop`, with the stack's CPU a request over it, in all and by part of the path, and
    the callers' own (this process's) beside it."""
    c0, own0 = cpu_ticks(roots), resource.getrusage(resource.RUSAGE_SELF)
    r = closed_loop(url, clients, seconds)
    c1, own1 = cpu_ticks(roots), resource.getrusage(resource.RUSAGE_SELF)
    r["cpu_ms_per_request"] = 1000 * cpu_seconds_between(c0, c1) / max(1, r["answered"])
    r["cpu_ms_by_part"] = cpu_ms_by_role(c0, c1, roles(roots), r["answered"])
    own = own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
    r["callers_cpu_ms_per_request"] = round(1000 * own / max(1, r["answered"]), 3)  # not the stack's
    return r


def cli(root: Path, home: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, "FAAS_GPU_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "faas_gpu.cli", *args], cwd=root, env=env, capture_output=True)
    out = p.stdout.decode() + p.stderr.decode()
    if check and p.returncode != 0:
        raise RuntimeError(f"faas-gpu {' '.join(args)}: {out[-3000:]}")
    return out


def project(root: Path) -> None:
    shutil.copytree(REPO / "functions" / "classify", root / "classify", ignore=shutil.ignore_patterns("*.pt"))
    fn = {
        "lang": "python3-gpu",
        "handler": "./classify",
        "image": "bench/classify:latest",
        "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "2"},
        "annotations": {
            "com.faas-gpu.model": "resnet-mini",
            "com.faas-gpu.model-source": "model.py:ResNetMini",
            "com.faas-gpu.input-shape": "3,32,32",
            "com.faas-gpu.slo-ms": str(int(SLO_S * 1000)),
        },
    }
    # today's plan under load, as the issue saw it: batch 1, timeout 0, one instance, and today's
    # hops: the watchdog proxying every call to index.py's own server (http mode, the template's
    # way before it served the handler in the watchdog's process)
    today = {
        "lang": "python3-gpu",
        "handler": "./classify",
        "image": "bench/classify:latest",
        "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "1"},
        "annotations": {"com.faas-gpu.max-batch": "1", "com.faas-gpu.slo-ms": str(int(SLO_S * 1000))},
        "environment": {"mode": "http"},
    }
    functions = {"classify": fn, "classify-b1": today}
    stack = {"version": 1.0, "provider": {"name": "openfaas"}, "functions": functions}
    (root / "stack.yml").write_text(yaml.safe_dump(stack))


def capacity(stack: StackProcess) -> dict:
    r = requests.get(f"{stack.provider_url}/system/function/classify/instances", auth=stack.auth, timeout=5)
    d = r.json()
    return {
        "capacity": d.get("capacity"),
        "instances": [(i["batch"], i["rUp"], round(i["batchTimeoutMs"], 1)) for i in d.get("instances", [])],
    }


def redeploy(root: Path, stack: StackProcess) -> None:
    requests.delete(f"{stack.url}/system/functions", json={"functionName": "classify"}, auth=stack.auth, timeout=30)
    time.sleep(1.0)
    cli(root, stack.home, "deploy", "-f", "stack.yml", "--gateway", stack.url)
    stack.wait_ready("classify", timeout_s=120)


def faas_gpu_runs(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="faas-gpu-path-limit-"))
    home = tmp / ".faas-gpu"
    home.mkdir()
    project(tmp)
    manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "256", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(
        home,
        "--scheduler",
        scheduler.url,
        "--cpus",
        "2",
        "--autoscale-period",
        "0.5",
        "--threads",
        "600",
        "--max-inflight-per-function",
        "600",
        *(["--pin-cpus", args.pin_cpus] if args.pin_cpus != "none" else []),
    ).start()
    roots = [stack.proc.pid, scheduler.proc.pid, manager.proc.pid]
    url = f"{stack.url}/function/classify"
    out: dict = {}
    try:
        cli(tmp, home, "build", "-f", "stack.yml")
        cli(tmp, home, "profile", "-f", "stack.yml", "classify", "--threads", "1", "--repeat", "5")
        cli(tmp, home, "deploy", "-f", "stack.yml", "--gateway", stack.url, "--filter", "classify-b1")
        stack.wait_ready("classify-b1", timeout_s=120)
        today_url = f"{stack.url}/function/classify-b1"
        closed_loop(today_url, 4, 3)  # warm: model on the unit, connections open

        # before: today's plan under load (batch 1, timeout 0, one instance: what INFless chose
        # when it predicted from the model's time alone)
        w = args.warmup
        # today's CPU a request at 8 clients: the same-run baseline of the after point's (the
        # issue's 7.6 ms was measured so, on its machine)
        closed_loop(today_url, 8, 3)
        out["before_8"] = with_cpu(today_url, 8, args.seconds, roots)
        print(f"before (batch 1), 8 clients: {out['before_8']}")
        closed_loop(today_url, 32, 3)
        before = closed_loop(today_url, 32, args.seconds)
        print(f"before (batch 1), 32 clients: {before}")
        today_max = before["rps"]
        before["open_at_max"] = open_loop(today_url, today_max, args.seconds)
        print(f"before, open loop at {today_max:.0f} rps: {before['open_at_max']}")
        out["before"] = before
        requests.delete(f"{stack.url}/system/functions", json={"functionName": "classify-b1"}, auth=stack.auth)
        cli(tmp, home, "deploy", "-f", "stack.yml", "--gateway", stack.url, "--filter", "classify")
        stack.wait_ready("classify", timeout_s=120)
        blind = capacity(stack)
        print(f"INFless without the path's cost plans: {blind}")
        out["blind_plan"] = blind

        # the path's cost, measured by faas-gpu profile --path, then a fresh plan that counts it
        print(cli(tmp, home, "profile", "--path", "classify", "--gateway", stack.url, "--path-seconds", "4"))
        redeploy(tmp, stack)
        closed_loop(url, 4, 3)
        after: dict = {}
        for clients in (1, 8, 32):
            closed_loop(url, clients, w)  # the autoscaler re-plans for this load
            r = with_cpu(url, clients, args.seconds, roots)
            r["plan"] = capacity(stack)
            after[clients] = r
            print(f"after, {clients} clients: {r}")
        peak = max(after[c]["rps"] for c in after)
        after["open"] = {}
        for frac in (0.5, 0.8, 1.0):
            o = open_loop(url, frac * peak, args.seconds)
            after["open"][frac] = o
            print(f"after, open loop at {frac:.0%} of {peak:.0f} rps: {o}")
        o = open_loop(url, today_max, args.seconds)
        after["open_at_today_max"] = o
        print(f"after, open loop at today's max {today_max:.0f} rps: {o}")
        after["plan_end"] = capacity(stack)
        print("describe:\n" + cli(tmp, home, "describe", "classify", "--gateway", stack.url, check=False))
        out["after"] = after
    finally:
        stack.stop()
        scheduler.kill()
        manager.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ray_serve(clients: int, seconds: float, batch: int) -> float | None:
    """Ray Serve, same model, `@serve.batch`, 1 replica: rps at `clients`; None when not installed."""
    try:
        from ray import serve  # noqa: PLC0415
    except ImportError:
        return None
    import ray  # noqa: PLC0415

    @serve.deployment(num_replicas=1, max_ongoing_requests=64)
    class Classify:
        def __init__(self) -> None:
            torch.set_num_threads(1)
            self.net = ResNetMini()
            self.net.load_state_dict(generate())
            self.net.eval()

        @serve.batch(max_batch_size=batch, batch_wait_timeout_s=0.01)
        async def run(self, seeds: list[int]) -> list[dict]:
            x = torch.cat([torch.randn(1, *IMAGE, generator=torch.Generator().manual_seed(s)) for s in seeds])
            with torch.inference_mode():
                probs = torch.softmax(self.net(x), dim=1)
            scores, classes = probs.max(dim=1)
            return [{"class": int(c), "score": float(s)} for c, s in zip(classes, scores, strict=True)]

        async def __call__(self, request) -> dict:
            body = await request.json()
            return await self.run(int(body.get("seed", 0)))

    # the replica's process imports ResNetMini and the weights' generator as this one does
    paths = os.pathsep.join([str(REPO), str(REPO / "functions" / "classify"), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": paths.rstrip(os.pathsep)}},
    )
    try:
        serve.run(Classify.bind(), route_prefix="/classify")
        url = "http://127.0.0.1:8000/classify"
        closed_loop(url, 4, 3)
        closed_loop(url, clients, 3)
        return closed_loop(url, clients, seconds)["rps"]
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds a point (default 8)")
    p.add_argument("--warmup", type=float, default=12.0, help="seconds of load before each point (default 12)")
    p.add_argument(
        "--pin-cpus",
        default=str(min(os.sched_getaffinity(0))),
        help="the stack's --pin-cpus: the gateway and the replica kept on these CPUs, the GPU Manager's "
        "worker free (default: the first CPU this process may use; none: not pinned)",
    )
    args = p.parse_args()

    variants = in_process(2.0)
    # the physical limit: the best batch of the faster of the model as written and as served
    best_v, best_b = max(((v, b) for v in variants for b in variants[v]), key=lambda vb: variants[vb[0]][vb[1]])
    offline, plain, served = variants[best_v], variants["plain"], variants["served"]
    for name, rates in variants.items():
        print(f"in-process images/s by batch, {name}: { {b: round(v) for b, v in rates.items()} }")
    print(f"best: batch {best_b}, {best_v}")
    runs = faas_gpu_runs(args)
    before, after = runs["before"], runs["after"]
    planned = [b for b, _, _ in after[32]["plan"]["instances"]]
    ray_batch = max(planned) if planned else 8  # the same batch size as faas-gpu's plan at 32 clients
    ray_rps = ray_serve(32, args.seconds, ray_batch)
    at32 = after[32]["rps"]
    result = {
        "inprocess_batch1_rps": round(plain[1], 1),
        "inprocess_best_batch": best_b,
        "inprocess_best_rps": round(offline[best_b], 1),
        "inprocess_best_model": best_v,
        "inprocess_served_rps_1_8": [round(served[1], 1), round(served[8], 1)],
        "path_rps_1_8_32": [round(after[c]["rps"], 1) for c in (1, 8, 32)],
        "path_p50_p99_ms_32": [round(after[32]["p50_ms"], 1), round(after[32]["p99_ms"], 1)],
        "before_rps_32": round(before["rps"], 1),
        "blind_predicted_rps": runs["blind_plan"]["capacity"]["predictedRps"],
        "before_overload_slo_pct": round(before["open_at_max"]["slo_pct"], 1),
        "speedup_32_vs_before": round(at32 / before["rps"], 3) if before["rps"] else None,
        "path_vs_inprocess_best_batch": round(at32 / offline[best_b], 3),
        "path_vs_inprocess_batch8": round(at32 / max(plain[8], served[8]), 3),
        "path_vs_ray_serve": None if ray_rps is None else round(at32 / ray_rps, 3),
        "ray_serve_rps_32": None if ray_rps is None else round(ray_rps, 1),
        "ray_serve_batch": None if ray_rps is None else ray_batch,
        "cpu_ms_per_request_batch8": round(after[8]["cpu_ms_per_request"], 2),
        "pin_cpus": args.pin_cpus,
        "cpu_ms_per_request_batch8_32_clients": round(after[32]["cpu_ms_per_request"], 2),
        # the same figure for today's configuration (batch 1, http mode) in this run, and how many
        # times less the after point costs: the issue asked 7.6 -> 2 ms, 3.8x, on its machine
        "before_cpu_ms_per_request_8_clients": round(runs["before_8"]["cpu_ms_per_request"], 2),
        "before_cpu_ms_by_part_8_clients": runs["before_8"]["cpu_ms_by_part"],
        "cpu_before_over_after_8_clients": round(
            runs["before_8"]["cpu_ms_per_request"] / after[8]["cpu_ms_per_request"], 2
        ),
        # the model's own CPU an image at batch 8 (one thread, in process, this run) as the workers
        # run it, and what the rest of the path costs beside it: the part of the 2 ms that is the
        # path's; and the model as written, for the rewrites' share
        "model_cpu_ms_per_image_batch8": round(1000 / served[8], 3),
        "model_cpu_ms_per_image_batch8_as_written": round(1000 / plain[8], 3),
        "path_cpu_ms_per_request_batch8": round(after[8]["cpu_ms_per_request"] - 1000 / served[8], 2),
        "cpu_ms_by_part_batch8": after[8]["cpu_ms_by_part"],
        "callers_cpu_ms_per_request_8_clients": after[8]["callers_cpu_ms_per_request"],
        "batch_at_8_clients": round(after[8]["mean_batch"], 2),
        "open_loop_slo_pct_50_80_100": [round(after["open"][f]["slo_pct"], 1) for f in (0.5, 0.8, 1.0)],
        "overload_slo_pct": round(after["open_at_today_max"]["slo_pct"], 1),
        "today_max_rps": round(before["rps"], 1),
        "batch_size_at_32_clients": round(after[32]["mean_batch"], 2),
        "predicted_vs_observed": after["plan_end"]["capacity"],
    }
    print(
        f"path at 32 clients / in-process best batch: {result['path_vs_inprocess_best_batch']}; "
        f"after / before at 32 clients: {result['speedup_32_vs_before']}; "
        f"within {SLO_S * 1000:.0f} ms at today's max: {result['before_overload_slo_pct']}% before, "
        f"{result['overload_slo_pct']}% after; CPU a request at 8 clients: "
        f"{result['before_cpu_ms_per_request_8_clients']} ms before, {result['cpu_ms_per_request_batch8']} after "
        f"({result['cpu_before_over_after_8_clients']}x less; the issue asked 7.6 -> 2, 3.8x)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
