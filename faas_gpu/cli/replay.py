"""`faas-gpu replay TRACE --compress F`: one trace through the live stack and the simulator, side by side.

The trace is read as `faas-gpu sim --trace` reads it (per-minute count files, the Azure Functions
2019 or 2021 CSVs; the same notes for what was assumed), its working set becomes that many
functions, each a real model, and its requests are sent on the trace's times divided by `F`:

1. **Functions.** Function i is `replay-i`: a handler that loads a torch.export MLP saved with
   `faas_gpu.save_model` (sizes cycled from `--model-mb`, the busiest function first) and runs it on
   `--rows` rows a request, so a cache miss loads a real model and a hit runs it. Each request is
   one job (`com.faas-gpu.max-batch: 1`) placed by the scheduler (`FAAS_GPU_LEASES=off`: a lease
   would send a function's batches past the placement policy); each answer carries its job's
   timings (queue, load, execute seconds, cache hit or miss, unit) in its body.
2. **Live side.** Per policy (`--policies`, default lb, lalb, lalb_o3), a fresh `faas-gpu up` on the
   cpu back end (`--units` emulated units of `--unit-memory-mb`, `--policy`), the functions built
   and deployed from a stack file; or, with `--gateway`, a stack already running, on the policy its
   scheduler reports. Calibration first: each function called once (its upload and first load)
   and `--calibration-calls` times more, one call at a time (the unit's overhead per job is taken
   from these, and the units' caches as they leave them are the simulator's start). Then the trace,
   open loop: every request sent when it is due, its latency taken from then (no coordinated
   omission). The stack is stopped (`faas-gpu down`) after each policy.
3. **Simulator side.** The same arrivals, policy, units and memory, the caches as the calibration
   left them, the live scheduler's admission in front of the policy, and the service times the live
   units measured in that run (`faas_gpu.sim.replay`: medians per function), plus the serving path
   outside the scheduler, measured, not simulated.
4. **Report.** Per policy: mean and P99 latency, SLO misses (`--slo-ms`), cold starts (cache
   misses), cache hit ratio, each live, simulated and sim / live; then one JSON line with the
   figures, `sim_over_live_<policy>_<figure>` for each ratio and `same_policy_order`. `--out`
   gets every request's outcome (`outcomes.csv`) and the figures (`replay.json`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

from faas_gpu.contract import env as env_vars
from faas_gpu.contract import headers as h
from faas_gpu.policies import Model
from faas_gpu.ports import free_port
from faas_gpu.sim.replay import (
    GOAL,
    KEEPALIVE_POLICIES,
    Figures,
    KeepAliveFigures,
    Outcome,
    Profile,
    ReplicaSample,
    figures,
    keepalive_table,
    keepalive_verdict,
    live_keepalive,
    measured_load_s,
    measured_profiles,
    measured_service_s,
    minute_counts,
    ratio,
    serving_path_s,
    simulate_keepalive,
    simulate_side,
    table,
    unit_hop_s,
    verdict,
)
from faas_gpu.sim.scenario import MAX_SPAN_MINUTES, Cluster, ScenarioError, TraceSpec, sniff_format
from faas_gpu.sim.trace import build_workload, read_trace

from .common import CliError, credentials

PREFIX = "replay-"
NAMESPACE = "openfaas-fn"
DEPTH = 4  # layers of each MLP
TIMINGS = {  # the body's keys, from the job's answer headers
    "cache": h.CACHE,
    "unit": h.UNIT,
    "scheduler_s": h.QUEUE_SECONDS,
    "load_s": h.LOAD_SECONDS,
    "exec_s": h.EXECUTE_SECONDS,
    "model_mb": h.MODEL_MB,
}
HANDLER = '''"""A replayed function (`faas-gpu replay`): an MLP saved with faas_gpu.save_model, run on {rows}
rows a request; the answer carries the job's timings, as its GPU client received them."""

import json
import os
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
model = torch.export.load(str(Path(__file__).resolve().parent / "model.pt2")).module()
INPUT = torch.ones({rows}, {width})
TIMINGS = {timings!r}

try:  # on the GPU path: the headers of the job this request's call ran in
    from faas_gpu.batching import last_job
except ImportError:  # the model ran right here
    last_job = None
PROCESS = {{"pid": os.getpid(), "started": time.time()}}  # a request sent before this waited for a cold start


def handle(event, context):
    with torch.inference_mode():
        model(INPUT)
    job = (last_job.get() if last_job is not None else None) or {{}}
    body = {{key: job.get(header) for key, header in TIMINGS.items()}}
    return {{
        "statusCode": 200,
        "body": json.dumps({{**body, **PROCESS}}),
        "headers": {{"Content-Type": "application/json"}},
    }}
'''


# -- the plan: functions, models, arrivals ----------------------------------------------------
@dataclass
class Plan:
    functions: list[str]  # replay-0 ... in the working set's order (busiest first)
    sources: list[str]  # the trace function (or window) behind each
    size_mb: list[float]  # the model's target size
    arrivals: list[tuple[float, str]]  # (s from the replay's start, compressed; function), by time
    duration_s: float  # the replayed minutes, compressed
    notes: list[str] = field(default_factory=list)
    minutes: int = 0  # trace minutes replayed
    compress: float = 1.0


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def sizes_arg(text: str) -> list[float]:
    try:
        sizes = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes in MB, comma-separated (8,16,32), got {text!r}") from None
    if not sizes or not all(0 < s <= 4096 and math.isfinite(s) for s in sizes):
        raise argparse.ArgumentTypeError(f"each size must be in (0, 4096] MB, got {text!r}")
    return sizes


def policies_arg(text: str) -> list[str]:
    names = [n.strip().lower().replace("-", "_") for n in text.split(",") if n.strip()]
    known = (*env_vars.PLACEMENT_POLICIES, *KEEPALIVE_POLICIES)
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(known)}, got {text!r}")
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="faas-gpu replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "trace",
        type=Path,
        nargs="+",
        help="an Azure Functions 2019 invocations CSV, a 2021 per-invocation CSV, or per-minute count files (one each)",
    )
    p.add_argument(
        "--compress",
        type=positive_float,
        help="time compression: a trace minute is replayed in 60/F seconds (the service times are not compressed); "
        "required for the placement policies",
    )
    p.add_argument("--minutes", type=positive_int, default=10, help="trace minutes replayed (default 10)")
    p.add_argument("--start-minute", type=non_negative_int, default=0, help="first minute replayed (default 0)")
    p.add_argument(
        "--working-set", type=positive_int, help="the busiest functions replayed (default: every function called)"
    )
    p.add_argument(
        "--reuse-functions",
        action="store_true",
        help="a working set larger than the trace's functions, from its other minutes (as faas-gpu sim)",
    )
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--scale", type=positive_float, help="multiply every minute's count by this (default 1)")
    rate.add_argument(
        "--mean-rate",
        type=positive_float,
        help="the scale that makes the replay's mean rate this many requests/s after compression (shape kept)",
    )
    p.add_argument("--max-span-minutes", type=positive_int, help=f"as faas-gpu sim (default {MAX_SPAN_MINUTES:,})")
    p.add_argument("--seed", type=int, default=1, help="arrival times inside a minute (default 1)")
    p.add_argument(
        "--policies",
        type=policies_arg,
        default=list(env_vars.PLACEMENT_POLICIES),
        help="placement policies, comma-separated (default lb,lalb,lalb_o3; with --gateway, the stack's)",
    )
    p.add_argument("--o3-limit", type=non_negative_int, default=25, help="lalb_o3's skip limit (default 25)")
    ka = p.add_argument_group(
        "INFless keep-alive (--policies with lsth and/or hhp): one more stack, its keep-alive clock compressed "
        "with the trace ($FAAS_GPU_KEEPALIVE_TIME_SCALE), each function deployed once per keep-alive policy"
    )
    ka.add_argument("--keepalive-minutes", type=positive_int, default=60, help="trace minutes replayed (default 60)")
    ka.add_argument(
        "--keepalive-working-set",
        type=positive_int,
        help="the busiest functions replayed, the trace's own (never reused), as recorded (default: every one called)",
    )
    ka.add_argument(
        "--keepalive-compress",
        type=positive_float,
        default=30.0,
        help="time compression of the keep-alive replay (default 30: a minute in 2 s), at most 3600",
    )
    p.add_argument("--units", type=positive_int, default=2, help="emulated units of the cpu back end (default 2)")
    p.add_argument("--unit-memory-mb", type=positive_float, default=96.0, help="memory of each unit (default 96)")
    p.add_argument(
        "--model-mb",
        type=sizes_arg,
        default=[8.0, 16.0, 32.0, 64.0],
        help="model sizes, cycled over the functions busiest first (default 8,16,32,64)",
    )
    p.add_argument("--rows", type=positive_int, default=8, help="input rows a request (default 8)")
    p.add_argument("--slo-ms", type=positive_float, default=1000.0, help="every function's SLO (default 1000)")
    p.add_argument(
        "--calibration-calls", type=positive_int, default=1, help="calls per function after its first (default 1)"
    )
    p.add_argument("--threads", type=positive_int, default=48, help="requests in flight at most (default 48)")
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=60.0,
        help="seconds a request may take before it counts as an error (default 60)",
    )
    p.add_argument(
        "--gateway",
        help="replay against this running stack (its credentials from $FAAS_GPU_HOME or the stack `up` recorded) "
        "instead of starting one per policy",
    )
    p.add_argument(
        "--out", type=Path, default=Path("replay-out"), help="outcomes.csv and replay.json (default replay-out)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (stacks' logs, functions)")
    return p


def plan_of(args: argparse.Namespace, keepalive: bool = False) -> Plan:
    """The working set and its arrivals, compressed; ScenarioError naming the flag at fault.
    `keepalive`: the keep-alive run's (`--keepalive-minutes`, `--keepalive-compress`,
    `--keepalive-working-set`: the trace's own functions as recorded, as Fig. 16 replays them)."""
    minutes = args.keepalive_minutes if keepalive else args.minutes
    compress = args.keepalive_compress if keepalive else args.compress
    scale = 1.0 if keepalive else args.scale or 1.0
    mean_rate = None if keepalive else args.mean_rate
    flag = "--keepalive-minutes" if keepalive else "--minutes"
    reuse = False if keepalive else args.reuse_functions  # keep-alive: the trace's own functions, as Fig. 16
    working_set = args.keepalive_working_set if keepalive else args.working_set
    for path in args.trace:
        if not path.is_file():
            raise ScenarioError(f"trace: {path} not found")
    try:
        formats = {sniff_format(p) for p in args.trace}
    except (UnicodeDecodeError, OSError) as exc:
        raise ScenarioError(f"trace: cannot read it as a trace: {exc}") from None
    fmt = formats.pop()
    if formats or (len(args.trace) > 1 and fmt != "per-minute"):
        raise ScenarioError("trace: several traces are per-minute count files, one function each")
    spec = TraceSpec(
        files=list(args.trace),
        format=fmt,
        minutes=minutes,
        start_minute=args.start_minute,
        working_set=1,
        reuse_functions=reuse,
        scale=scale,
        arrivals="recorded" if fmt == "azure2021" else "poisson",
        infer_time="catalog",  # the replay's own models run; a recorded duration says nothing of them
        max_span_minutes=args.max_span_minutes or MAX_SPAN_MINUTES,
    )
    notes: list[str] = []
    until = None if reuse else args.start_minute + minutes
    functions = read_trace(spec, notes, until)
    lo, hi = args.start_minute, args.start_minute + minutes
    length = max(f.minutes for f in functions)
    if hi > length:
        raise ScenarioError(f"{flag}: the trace has {length} minutes, asked for {lo}..{hi}")
    invoked = sum(1 for f in functions if f.counts[lo:hi].sum() > 0)
    if not invoked:
        raise ScenarioError(f"trace: no invocations in minutes {lo}..{hi}")
    spec.working_set = working_set or invoked
    if mean_rate:
        spec.mean_requests_per_minute = mean_rate * 60.0 / compress
    catalog = [Model(f"m{i}", 1.0, 1.0, 1.0) for i in range(spec.working_set)]  # named per function below
    workload = build_workload(spec, catalog, args.seed, functions)
    k = len(workload.models)
    names = [f"{PREFIX}{i}" for i in range(k)]
    of_model = {m.name: names[i] for i, m in enumerate(workload.models)}
    arrivals = [(a.time / compress, of_model[a.model]) for a in workload.arrivals]
    sizes = [args.model_mb[i % len(args.model_mb)] for i in range(k)]
    too_big = [s for s in sizes if s > args.unit_memory_mb]
    if too_big:
        raise ScenarioError(
            f"--model-mb: {max(too_big):g} MB does not fit a unit of --unit-memory-mb {args.unit_memory_mb:g}"
        )
    duration = minutes * 60.0 / compress
    notes = notes + workload.notes
    notes.append(
        f"{'keep-alive replay' if keepalive else 'replay'}: minutes {lo}..{hi} of "
        f"{', '.join(p.name for p in args.trace)} ({fmt}), {len(arrivals)} requests of {k} functions compressed "
        f"x{compress:g} into {duration:.0f} s ({len(arrivals) / duration:.2f} requests/s)"
    )
    return Plan(names, list(workload.functions), sizes, arrivals, duration, notes, minutes, compress)


def write_functions(plan: Plan, folder: Path, rows: int) -> Path:
    """Each function's folder (its model saved with faas_gpu.save_model, its handler) and the stack file."""
    import torch
    import yaml

    from faas_gpu import save_model

    torch.manual_seed(0)
    functions = {}
    for name, size in zip(plan.functions, plan.size_mb, strict=True):
        width = max(8, int(math.sqrt(size * 2**20 / 4 / DEPTH)))
        model = torch.nn.Sequential(
            *[layer for _ in range(DEPTH) for layer in (torch.nn.Linear(width, width), torch.nn.ReLU())]
        )
        d = folder / name
        d.mkdir(parents=True, exist_ok=True)
        save_model(model, torch.ones(1, width), d / "model.pt2")
        (d / "handler.py").write_text(HANDLER.format(rows=rows, width=width, timings=TIMINGS))
        (d / "requirements.txt").write_text("")
        functions[name] = {
            "lang": "python3-gpu",
            "handler": f"./{name}",
            "image": f"faas-gpu-replay/{name}:latest",
            "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "1"},
            "annotations": {"com.faas-gpu.max-batch": "1"},
            "environment": {
                env_vars.LEASES.name: "off",
                "handler_threads": "64",
                env_vars.MAX_INFLIGHT.name: "64",
                "exec_timeout": "120s",
                "write_timeout": "120s",
            },
        }
    stack = folder / "stack.yml"
    stack.write_text(yaml.safe_dump({"version": 1.0, "provider": {"name": "openfaas"}, "functions": functions}))
    return stack


KEEPALIVE_MODEL = "replay-keepalive-mlp"
KEEPALIVE_WIDTH = 64
KEEPALIVE_SOURCE = """import torch
from torch import nn

WIDTH = {width}


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)).eval()
"""


def keepalive_name(policy: str, function: str) -> str:
    return f"ka-{policy}-{function.removeprefix(PREFIX)}"


def write_keepalive_functions(plan: Plan, folder: Path, policies: list[str]) -> Path:
    """Each function once per keep-alive policy (`ka-lsth-0`, `ka-hhp-0`, ...): INFless-scaled
    (one small MLP profiled once, by `faas-gpu up`), taken to zero when idle (`scale-zero`), its
    keep-alive the policy's; the handler says which process answered and when it started."""
    import torch
    import yaml

    from faas_gpu import save_model

    d = folder / "keepalive-model"
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.py").write_text(KEEPALIVE_SOURCE.format(width=KEEPALIVE_WIDTH))
    namespace: dict = {}
    exec(compile((d / "model.py").read_text(), str(d / "model.py"), "exec"), namespace)  # noqa: S102 (our own text)
    artifact = d / "model.pt2"
    save_model(namespace["make"](), torch.ones(1, KEEPALIVE_WIDTH), artifact)
    functions = {}
    for policy in policies:
        for name in plan.functions:
            fn = keepalive_name(policy, name)
            f = folder / fn
            f.mkdir(parents=True, exist_ok=True)
            shutil.copy(artifact, f / "model.pt2")
            shutil.copy(d / "model.py", f / "model.py")
            (f / "handler.py").write_text(HANDLER.format(rows=1, width=KEEPALIVE_WIDTH, timings=TIMINGS))
            (f / "requirements.txt").write_text("")
            functions[fn] = {
                "lang": "python3-gpu",
                "handler": f"./{fn}",
                "image": f"faas-gpu-replay/{fn}:latest",
                "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "1"},
                "annotations": {
                    "com.faas-gpu.model": KEEPALIVE_MODEL,
                    "com.faas-gpu.model-source": "model.py:make",
                    "com.faas-gpu.input-shape": str(KEEPALIVE_WIDTH),
                    "com.faas-gpu.slo-ms": "10000",
                    "com.faas-gpu.scale-zero": "true",
                    "com.faas-gpu.keep-alive": policy,
                },
                "environment": {env_vars.LEASES.name: "off", "exec_timeout": "120s", "write_timeout": "120s"},
            }
    stack = folder / "keepalive-stack.yml"
    stack.write_text(yaml.safe_dump({"version": 1.0, "provider": {"name": "openfaas"}, "functions": functions}))
    return stack


@dataclass
class KeepAliveRun:
    live: dict[str, list[Outcome]]  # per keep-alive policy, its functions' outcomes (named replay-i)
    samples: dict[str, list[ReplicaSample]]
    wall_s: float


def run_keepalive(plan: Plan, folder: Path, args: argparse.Namespace, policies: list[str]) -> KeepAliveRun:
    """One stack, its provider's keep-alive clock compressed with the trace, every function deployed
    once per keep-alive policy: each request of the trace is sent to each policy's copy at once."""
    stack_file = write_keepalive_functions(plan, folder, policies)
    env = {
        env_vars.KEEPALIVE_TIME_SCALE.name: f"{plan.compress:g}",
        env_vars.CPUS.name: "64",  # INFless places instances on the node's CPUs: room for every function's
    }
    stack = LiveStack(folder, stack_file, args, env_vars.PLACEMENT.default, name="keepalive", env=env)
    t0 = time.perf_counter()
    names = {keepalive_name(p, f): (p, f) for p in policies for f in plan.functions}
    samples: dict[str, list[ReplicaSample]] = {p: [] for p in policies}
    try:
        stack.start()
        sender = Sender(stack.gateway, args.request_timeout)
        print(
            f"  keep-alive: replaying {len(plan.arrivals)} requests x {len(policies)} for {plan.duration_s:.0f} s",
            file=sys.stderr,
        )
        stop = threading.Event()
        start = aligned_start(plan.compress)

        def sample() -> None:
            session = requests.Session()
            while not stop.is_set():
                now = time.perf_counter() - start
                try:
                    listed = session.get(f"{stack.gateway}/system/functions", auth=stack.auth, timeout=5).json()
                except (requests.RequestException, ValueError):
                    listed = []
                for fn in listed if isinstance(listed, list) else []:
                    if isinstance(fn, dict) and fn.get("name") in names:
                        policy, function = names[fn["name"]]
                        # running replicas, a starting one too: it holds its process as a warm one does
                        running = int(_float(fn.get("replicas")) or 0)
                        samples[policy].append(ReplicaSample(now, function, running))
                stop.wait(SAMPLE_S)

        sampler = threading.Thread(target=sample, name="replicas", daemon=True)
        sampler.start()
        arrivals = [(t, keepalive_name(p, f)) for t, f in plan.arrivals for p in policies]
        try:
            outcomes = replay(sender, arrivals, args.threads, start=start)
        finally:
            stop.set()
            sampler.join(10)
    finally:
        stack.stop()
    live: dict[str, list[Outcome]] = {p: [] for p in policies}
    for o in outcomes:
        policy, function = names[o.function]
        o.function = function
        live[policy].append(o)
    return KeepAliveRun(live, samples, time.perf_counter() - t0)


def aligned_start(
    compress: float,
    lead_s: float = 0.5,
    wall: Callable[[], float] = time.time,
    counter: Callable[[], float] = time.perf_counter,
) -> float:
    """When (on `counter`'s clock) to send the trace's first minute: at least `lead_s` from now, at a
    wall time that is a multiple of 60/compress, where the provider's compressed keep-alive clock
    (`provider.scaling.scaled_wall`: the wall's times `compress`) begins a minute. Each trace minute
    is then one minute of the live invocation history, as the simulator's replay counts it."""
    period = 60.0 / compress
    now_wall, now = wall(), counter()
    return now + math.ceil((now_wall + lead_s) / period) * period - now_wall


SAMPLE_S = 0.5
"""How often the keep-alive run reads the functions' ready replicas from the gateway (s)."""


# -- the live side ----------------------------------------------------------------------------
class LiveStack:
    """A stack of one policy: started with `faas-gpu up` in a state folder of its own, or the one at
    `--gateway`; driven only through the CLI and the gateway's HTTP routes."""

    def __init__(
        self,
        folder: Path,
        stack_file: Path,
        args: argparse.Namespace,
        policy: str | None,
        *,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ):
        """`policy`: the placement the stack is started with (None: the running stack at --gateway);
        `name`: its state folder's (default the policy's); `env`: what its daemons are started with."""
        self.folder, self.stack_file, self.args, self.policy = folder, stack_file, args, policy
        self.home = folder / f"home-{name or policy}" if policy else None
        self.gateway = args.gateway.rstrip("/") if args.gateway and policy is None else ""
        self.env = env or {}
        self.auth: tuple[str, str] | None = None
        self.started = False

    def _cli(self, *argv: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env}
        if self.home is not None:
            env[env_vars.HOME.name] = str(self.home)
        try:
            return subprocess.run(
                [sys.executable, "-m", "faas_gpu.cli", *argv],
                cwd=self.folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:  # a part that failed, said, not a traceback
            said = exc.stderr or exc.output or ""
            said = said.decode(errors="replace") if isinstance(said, bytes) else said
            tail = f": {said.strip()[-500:]}" if said.strip() else ""
            where = f" (logs in {self.home})" if self.home is not None else ""
            raise CliError(f"faas-gpu {argv[0]} did not finish within {timeout_s:.0f}s{tail}{where}") from None

    def start(self) -> None:
        a = self.args
        if self.home is None:  # a running stack: deploy the functions there
            self.auth = credentials(argparse.Namespace(), self.gateway)
            for step in (
                ("build", "-f", str(self.stack_file)),
                ("deploy", "-f", str(self.stack_file), "--gateway", self.gateway),
            ):
                r = self._cli(*step)
                if r.returncode != 0:
                    raise CliError(f"faas-gpu {step[0]} for the replay failed: {(r.stderr or r.stdout).strip()[-500:]}")
            self._wait_ready()
            return
        port = free_port()
        self.gateway = f"http://127.0.0.1:{port}"
        self.started = True
        r = self._cli(
            "up", "-f", str(self.stack_file), "--no-progress",
            "--backend", "cpu", "--gpu-units", str(a.units), "--unit-memory-mb", f"{a.unit_memory_mb:g}",
            "--policy", self.policy, "--o3-limit", str(a.o3_limit),
            "--gateway-port", str(port), "--provider-port", str(free_port()), "--metrics-port", "0",
            "--gpu-manager-port", str(free_port()), "--scheduler-port", str(free_port()),
        )  # fmt: skip
        if r.returncode != 0:
            raise CliError(
                f"faas-gpu up ({self.policy}) failed: {(r.stderr or r.stdout).strip()[-800:]} (logs in {self.home})"
            )
        self.auth = credentials(argparse.Namespace(), self.gateway, self.home)

    def _wait_ready(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        for name in yaml_functions(self.stack_file):
            while True:
                r = requests.get(f"{self.gateway}/system/function/{name}", auth=self.auth, timeout=10)
                if r.status_code == 200 and _available(r) > 0:
                    break
                if time.monotonic() > deadline:
                    raise CliError(f"{name} did not become ready on {self.gateway} within {timeout_s:.0f}s")
                time.sleep(0.3)

    def status(self) -> dict:
        r = requests.get(f"{self.gateway}/ui/api/status", auth=self.auth, timeout=10)
        if r.status_code != 200:
            raise CliError(f"{self.gateway}/ui/api/status answered {r.status_code}: {r.text.strip()[:200]}")
        try:
            status = r.json()
        except ValueError:
            status = None
        if not isinstance(status, dict):
            raise CliError(f"{self.gateway}/ui/api/status: not the status page's JSON object")
        return status

    def stop(self) -> None:
        """Best effort: a stop that times out is said, and never hides what failed before it."""
        try:
            if self.home is None:
                self._cli("remove", "-f", str(self.stack_file), "--gateway", self.gateway, timeout_s=120)
            elif self.started:
                self._cli("down", timeout_s=180)
        except CliError as exc:
            print(f"faas-gpu replay: stopping the stack: {exc}", file=sys.stderr)


def _available(r: requests.Response) -> int:
    try:
        body = r.json()
        return int(body.get("availableReplicas") or 0) if isinstance(body, dict) else 0
    except (ValueError, TypeError):
        return 0


def yaml_functions(stack_file: Path) -> list[str]:
    import yaml

    return list((yaml.safe_load(stack_file.read_text()) or {}).get("functions") or {})


class Sender:
    """Calls to the gateway, one HTTP session per thread; each answer becomes an `Outcome`."""

    def __init__(self, gateway: str, timeout_s: float = 180):
        self.gateway, self.timeout_s = gateway, timeout_s
        self._local = threading.local()

    def call(self, function: str, due: float, sent_s: float) -> Outcome:
        """`due`: the perf_counter time the request was due at (its latency counts from then)."""
        due_wall = time.time() - (time.perf_counter() - due)
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        try:
            r = session.post(f"{self.gateway}/function/{function}", data=b"{}", timeout=self.timeout_s)
        except requests.RequestException as exc:
            return Outcome(function, sent_s, None, status=type(exc).__name__)
        latency = time.perf_counter() - due
        if r.status_code != 200:
            return Outcome(function, sent_s, None, status=r.status_code)
        try:
            body = r.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):  # a function of the same name that is not the replay's
            body = {}
        return Outcome(
            function,
            sent_s,
            latency,
            200,
            cache=body.get("cache") or r.headers.get(h.CACHE),
            unit=body.get("unit") or r.headers.get(h.UNIT),
            scheduler_s=_float(body.get("scheduler_s")),
            load_s=_float(body.get("load_s")),
            exec_s=_float(body.get("exec_s")),
            model_mb=_float(body.get("model_mb")),
            process=process_of(body),
            cold=None if _float(body.get("started")) is None else _float(body.get("started")) > due_wall,
        )


def process_of(body: dict) -> str | None:
    """The replica process that answered: its pid and when it started. A replica in a PID namespace
    of its own is pid 1 in every start, and by pid alone every cold start of a function was one."""
    if "pid" not in body:
        return None
    return f"{body['pid']}@{body.get('started')}"


def _float(value: object) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def calibrate(sender: Sender, functions: list[str], calls: int) -> tuple[list[Outcome], list[Outcome]]:
    """Each function's first call (its upload and first load, retried until answered), then
    `calls` more, one at a time. Returns (first calls, the calls after them)."""
    first, after = [], []
    for name in functions:
        for _ in range(5):
            t = time.perf_counter()
            o = sender.call(name, t, 0.0)
            if o.answered:
                break
            time.sleep(1.0)
        else:
            raise CliError(f"{name}: its first call failed five times (last: {o.status})")
        first.append(o)
    for name in functions:
        for _ in range(calls):
            t = time.perf_counter()
            after.append(sender.call(name, t, 0.0))
    return first, after


def replay(
    sender: Sender, arrivals: list[tuple[float, str]], threads: int, start: float | None = None
) -> list[Outcome]:
    """Open loop: each request sent when due (a pool thread per request in flight), its latency
    from when it was due; `start`: the perf_counter time of the trace's second 0 (default: soon)."""
    outcomes: list[Outcome | None] = [None] * len(arrivals)
    start = time.perf_counter() + 0.5 if start is None else start

    def one(i: int) -> None:
        t, name = arrivals[i]
        outcomes[i] = sender.call(name, start + t, t)

    with ThreadPoolExecutor(threads, thread_name_prefix="replay") as pool:
        for i, (t, _) in enumerate(arrivals):
            wait = start + t - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, i)
    return [
        o if o is not None else Outcome(arrivals[i][1], arrivals[i][0], None, "lost") for i, o in enumerate(outcomes)
    ]


def cluster_and_caches(status: dict, functions: list[str]) -> tuple[Cluster, dict[int, list[str]], str | None, int]:
    """The units as the scheduler orders them (by key), their memory, the replay's models each
    caches (least recently used first), and the scheduler's policy and skip limit. CliError, saying
    what, for a status page whose JSON is not what faas-gpu serves."""
    try:
        return _cluster_and_caches(status, functions)
    except (AttributeError, TypeError, ValueError) as exc:
        raise CliError(f"the status page's JSON is not what faas-gpu serves ({type(exc).__name__}: {exc})") from None


def _cluster_and_caches(status: dict, functions: list[str]) -> tuple[Cluster, dict[int, list[str]], str | None, int]:
    units = sorted((u for u in status.get("units") or [] if isinstance(u, dict)), key=lambda u: str(u.get("key")))
    if not units:
        raise CliError("the stack reports no GPU unit: the replay needs its GPU path (faas-gpu up without --no-gpu)")
    memory = {float(u.get("memoryMb") or 0) for u in units}
    if len(memory) > 1:
        raise CliError(
            f"the stack's units differ in memory ({sorted(memory)} MB): the simulator's cluster has one size"
        )
    size = memory.pop()
    if not (size > 0 and math.isfinite(size)):
        raise CliError(f"the stack's units report {size} MB of memory")
    known = set(functions)
    warm: dict[int, list[str]] = {}
    for i, u in enumerate(units):
        for m in u.get("models") or []:
            for owner in (m.get("functions") if isinstance(m, dict) else None) or []:
                name = str(owner).rsplit(".", 1)[0]
                if name in known:
                    warm.setdefault(i, []).append(name)
                    break
    sched = status.get("scheduler") or {}
    policy, limit = sched.get("policy"), sched.get("o3Limit")
    return Cluster(1, len(units), size), warm, str(policy) if policy else None, int(limit or 0)


@dataclass
class Run:
    policy: str
    live: list[Outcome]
    sim: list[Outcome]  # each request's live service time
    sim_median: list[Outcome]  # each function's median service time
    calibration: list[Outcome]
    profiles: dict[str, Profile]
    idle: dict[str, Profile]
    path_s: float
    hop_s: float
    cluster: Cluster
    warm: dict[int, list[str]]
    wall_s: float
    o3_limit: int = 0


def run_policy(plan: Plan, folder: Path, stack_file: Path, args: argparse.Namespace, policy: str | None) -> Run:
    stack = LiveStack(folder, stack_file, args, policy)
    t0 = time.perf_counter()
    try:
        stack.start()
        sender = Sender(stack.gateway, args.request_timeout)
        first, calls = calibrate(sender, plan.functions, args.calibration_calls)
        status = settled_status(stack)
        cluster, warm, running, limit = cluster_and_caches(status, plan.functions)
        if policy is None:  # --gateway: the stack's own
            if running not in env_vars.PLACEMENT_POLICIES:
                raise CliError(f"{stack.gateway}: its scheduler does not say which placement policy it runs")
            policy = running
        elif running not in (None, policy):
            raise CliError(f"the stack started for {policy} runs {running}")
        o3_limit = limit if policy == "lalb_o3" and limit else args.o3_limit
        print(
            f"  {policy}: calibrated; replaying {len(plan.arrivals)} requests for {plan.duration_s:.0f} s",
            file=sys.stderr,
        )
        live = replay(sender, plan.arrivals, args.threads)
    finally:
        stack.stop()
    hop = unit_hop_s(calls, live)
    idle = idle_profiles(plan, first, calls, hop)
    profiles = measured_profiles(live, idle, hop)
    path = serving_path_s(live)
    service = measured_service_s(live, hop)
    loads = measured_load_s(live)
    sim = simulate_side(plan.arrivals, profiles, cluster, policy, o3_limit, path, warm, service, loads)
    medians = simulate_side(plan.arrivals, profiles, cluster, policy, o3_limit, path, warm)
    return Run(
        policy,
        live,
        sim.outcomes,
        medians.outcomes,
        first + calls,
        profiles,
        idle,
        path,
        hop,
        cluster,
        warm,
        time.perf_counter() - t0,
        o3_limit,
    )


def settled_status(stack: LiveStack, timeout_s: float = 10.0) -> dict:
    """The status page once two reads agree on the units' caches (managers report on their own time)."""
    last = None
    deadline = time.monotonic() + timeout_s
    while True:
        status = stack.status()
        caches = [(u.get("key"), [m.get("digest") for m in u.get("models") or []]) for u in status.get("units") or []]
        if caches == last or time.monotonic() > deadline:
            return status
        last = caches
        time.sleep(1.1)


def idle_profiles(plan: Plan, first: list[Outcome], calls: list[Outcome], hop_s: float) -> dict[str, Profile]:
    """What the calibration measured, one call at a time: the first load, the median execute time."""
    out = {}
    for name, size in zip(plan.functions, plan.size_mb, strict=True):
        f = next((o for o in first if o.function == name), None)
        execs = sorted(o.exec_s for o in calls if o.function == name and o.exec_s is not None)
        exec_s = execs[len(execs) // 2] if execs else (f.exec_s if f and f.exec_s else 0.01)
        out[name] = Profile(
            (f.model_mb if f and f.model_mb else size), (f.load_s if f and f.load_s else 0.1), exec_s + hop_s
        )
    return out


# -- the report -------------------------------------------------------------------------------
def write_outcomes(path: Path, runs: list[Run], keepalive: KeepAliveRun | None = None) -> None:
    columns = ["side", "policy", "function", "sent_s", "latency_s", "status", "cache", "unit"]
    timings = ["scheduler_s", "load_s", "exec_s", "model_mb"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*columns, *timings, "process", "cold"])
        sides = [(side, r.policy, outs) for r in runs for side, outs in (("live", r.live), ("sim", r.sim))]
        sides += [("live", p, outs) for p, outs in (keepalive.live.items() if keepalive else [])]
        for side, policy, outcomes in sides:
            for o in outcomes:
                latency = "" if o.latency_s is None else f"{o.latency_s:.5f}"
                row = [side, policy, o.function, f"{o.sent_s:.4f}", latency, o.status, o.cache or "", o.unit or ""]
                row += ["" if v is None else f"{v:.5f}" for v in (o.scheduler_s, o.load_s, o.exec_s, o.model_mb)]
                w.writerow([*row, o.process or "", "" if o.cold is None else int(o.cold)])


def run_record(run: Run) -> dict:
    """What the simulator side was given for one policy (`runs.json`), to simulate it again."""
    return {
        "policy": run.policy,
        "o3_limit": run.o3_limit,
        "units": run.cluster.units_per_node,
        "unit_memory_mb": run.cluster.unit_memory_mb,
        "warm": {str(k): v for k, v in run.warm.items()},
        "path_s": run.path_s,
        "unit_overhead_s": run.hop_s,
        "profiles": {n: vars(p) for n, p in run.profiles.items()},
        "idle_profiles": {n: vars(p) for n, p in run.idle.items()},
        "wall_s": run.wall_s,
    }


def profile_lines(run: Run) -> list[str]:
    lines = [
        f"  {run.policy}: serving path outside the scheduler {1000 * run.path_s:.1f} ms (added to each simulated "
        f"latency), the unit's overhead per job {1000 * run.hop_s:.1f} ms; per function, idle (calibration) -> "
        "in this run: load ms, execute ms (incl. overhead), MB"
    ]
    for name, p in run.profiles.items():
        i = run.idle[name]
        lines.append(
            f"    {name:<10} load {1000 * i.load_s:6.0f} -> {1000 * p.load_s:6.0f}   execute {1000 * i.exec_s:6.1f} -> "
            f"{1000 * p.exec_s:6.1f}   {p.size_mb:6.1f} MB"
        )
    return lines


def ratio_or_none(sim: float, live: float) -> float | None:
    r = ratio(sim, live)
    return None if r is None else round(r, 4)


def _stop_on_sigterm() -> None:
    """SIGTERM (a benchmark's time limit, `kill`) unwinds like Ctrl-C: the stacks started are stopped."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _stop_on_sigterm()
    placement = [p for p in args.policies if p in env_vars.PLACEMENT_POLICIES]
    keepalive = [p for p in args.policies if p in KEEPALIVE_POLICIES]
    if args.gateway and keepalive:
        print(
            "faas-gpu replay: --policies: lsth and hhp run on a stack of their own (its keep-alive clock compressed "
            "with the trace), not with --gateway",
            file=sys.stderr,
        )
        return 2
    if (placement or args.gateway) and args.compress is None:
        print("faas-gpu replay: --compress: required for the placement policies (lb, lalb, lalb_o3)", file=sys.stderr)
        return 2
    if keepalive and args.keepalive_compress > 3600:
        print(f"faas-gpu replay: --keepalive-compress: at most 3600, got {args.keepalive_compress:g}", file=sys.stderr)
        return 2
    try:
        plan = plan_of(args) if placement or args.gateway else None
        ka_plan = plan_of(args, keepalive=True) if keepalive else None
    except ScenarioError as exc:
        print(f"faas-gpu replay: {exc}", file=sys.stderr)
        return 2
    for note in (plan.notes if plan else []) + (ka_plan.notes if ka_plan else []):
        print(note, file=sys.stderr)
    folder = Path(tempfile.mkdtemp(prefix="faas-gpu-replay-"))
    runs: list[Run] = []
    ka_run: KeepAliveRun | None = None
    failed: list[str] = []  # a part that failed: the others are still reported
    try:
        if plan is not None:
            try:
                stack_file = write_functions(plan, folder, args.rows)
                for policy in [None] if args.gateway else placement:
                    runs.append(run_policy(plan, folder, stack_file, args, policy))
            except CliError as exc:
                failed.append(f"placement: {exc}")
        if ka_plan is not None:
            try:
                ka_run = run_keepalive(ka_plan, folder, args, keepalive)
            except CliError as exc:
                failed.append(f"keep-alive: {exc}")
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    for message in failed:
        print(f"faas-gpu replay: {message}", file=sys.stderr)
    if not runs and ka_run is None:
        return 1
    result: dict[str, object] = {}
    if runs and plan is not None:
        result.update(report_placement(plan, runs, args))
    if ka_plan is not None and ka_run is not None:
        result.update(report_keepalive(ka_plan, ka_run))
    if runs and ka_run is not None:  # both sides rank the placements and the keep-alives alike
        result["same_policy_order"] = bool(result["same_policy_order"]) and bool(result["same_keepalive_order"])
    elif ka_run is not None:
        result["same_policy_order"] = result["same_keepalive_order"]
    if failed:
        result["failed"] = failed
    args.out.mkdir(parents=True, exist_ok=True)
    write_outcomes(args.out / "outcomes.csv", runs, ka_run)
    (args.out / "replay.json").write_text(json.dumps(result, indent=1))
    (args.out / "runs.json").write_text(json.dumps([run_record(r) for r in runs], indent=1))
    print(f"wrote {args.out / 'outcomes.csv'}, replay.json and runs.json beside it", file=sys.stderr)
    print(json.dumps(result))
    return 1 if failed else 0


def report_placement(plan: Plan, runs: list[Run], args: argparse.Namespace) -> dict[str, object]:
    """The placement policies side by side (printed), and their figures for the JSON line."""
    slo = {name: args.slo_ms / 1000.0 for name in plan.functions}
    live: dict[str, Figures] = {r.policy: figures(r.live, slo) for r in runs}
    sim: dict[str, Figures] = {r.policy: figures(r.sim, slo, r.live) for r in runs}
    median: dict[str, Figures] = {r.policy: figures(r.sim_median, slo, r.live) for r in runs}
    for run in runs:
        for line in profile_lines(run):
            print(line, file=sys.stderr)
    print(table(sim, live))
    failed = {p: f.errors for p, f in live.items() if f.errors}
    if failed:
        print(
            "live errors (not answered 200 within --request-timeout): "
            + ", ".join(f"{p} {n}" for p, n in failed.items())
            + "; both sides' latencies are over the requests the live side answered, the errors count as SLO misses"
        )
    print(
        "the same with each function's median service time instead of each request's (sim/live): "
        + "; ".join(
            f"{p} mean {ratio_or_none(median[p].mean_latency, live[p].mean_latency)}, miss ratio "
            f"{ratio_or_none(median[p].miss_ratio, live[p].miss_ratio)}"
            for p in live
        )
    )
    return {
        "requests": len(plan.arrivals),
        "functions": len(plan.functions),
        "compress": plan.compress,
        "replay_s": round(plan.duration_s, 1),
        "units": runs[0].cluster.units_per_node if runs else args.units,
        "unit_memory_mb": runs[0].cluster.unit_memory_mb if runs else args.unit_memory_mb,
        "slo_ms": args.slo_ms,
        **{f"live_{p}_{k}": round(v, 4) for p, f in live.items() for k, v in f.as_dict().items()},
        **{f"sim_{p}_{k}": round(v, 4) for p, f in sim.items() for k, v in f.as_dict().items()},
        **{f"path_ms_{r.policy}": round(1000 * r.path_s, 2) for r in runs},
        **{f"unit_overhead_ms_{r.policy}": round(1000 * r.hop_s, 2) for r in runs},
        **{f"wall_s_{r.policy}": round(r.wall_s, 1) for r in runs},
        **{
            f"sim_median_over_live_{p}_{k}": ratio_or_none(median[p].value(k), live[p].value(k))
            for p in live
            for k in GOAL
        },
        **verdict(sim, live),
    }


def report_keepalive(plan: Plan, run: KeepAliveRun) -> dict[str, object]:
    """LSTH against HHP side by side (printed): cold starts and idle minutes as the Fig. 16 replay
    counts them on the simulator's side, and as the live replicas showed them."""
    counts = minute_counts(plan.arrivals, plan.functions, plan.compress, plan.minutes)
    sim: dict[str, KeepAliveFigures] = {p: simulate_keepalive(counts, p) for p in run.live}
    live: dict[str, KeepAliveFigures] = {
        p: live_keepalive(run.live[p], run.samples[p], counts, plan.compress, plan.minutes) for p in run.live
    }
    print(keepalive_table(sim, live))
    latency = {p: figures(run.live[p], {}) for p in run.live}
    print(
        "keep-alive, live latency (s): "
        + "; ".join(
            f"{p} mean {f.mean_latency:.3f}, P99 {f.p99_latency:.3f}, errors {f.errors}" for p, f in latency.items()
        )
        + " (the minute-granularity replay has no latency to compare)"
    )
    return {
        "keepalive_requests": len(plan.arrivals),
        "keepalive_minutes": plan.minutes,
        "keepalive_compress": plan.compress,
        **{f"live_{p}_{k}": round(v, 4) for p, f in live.items() for k, v in f.as_dict().items()},
        **{f"sim_{p}_{k}": round(v, 4) for p, f in sim.items() for k, v in f.as_dict().items()},
        **{f"live_{p}_mean_latency": round(f.mean_latency, 4) for p, f in latency.items()},
        "wall_s_keepalive": round(run.wall_s, 1),
        **keepalive_verdict(sim, live),
    }


if __name__ == "__main__":
    sys.exit(main())
