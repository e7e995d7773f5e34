"""The serverless lifecycle on the whole stack (issue 46): wake-ups from zero, and a load step.

One stack on this machine as `faas-gpu up` runs it (GPU Manager on the cpu back end, scheduler,
gateway + provider), the examples of functions/ (echo, classify, embed) and two model functions
of its own whose handlers load for 0 s and for 8 s (`wake-fast`, `wake-slow`), every one labelled
`com.openfaas.scale.zero: "true"`:

- **wake-ups**: each function is taken to zero (`POST /system/scale-function` with 0 replicas,
  what OpenFaaS Pro's idler sends; the function's own zero-duration would do the same, slower) and
  called; the call's time to its answer is split by what its answer says:
  * `replica_start`: the gateway's wait for a ready replica (`X-Faas-Gpu-Cold-Start-Seconds`:
    process start, torch and the handler imported, the model built);
  * `upload`: the replica's first batch making its model's artifact (torch.export, unless an
    earlier replica's is known to the scheduler) and uploading it (`X-Faas-Gpu-Upload-Seconds`);
  * `model_load`: the model loaded on a unit, on a miss (`X-Faas-Gpu-Load-Seconds`);
  * `first_batch`: the batch's own execution (`X-Faas-Gpu-Execute-Seconds`);
  * `other`: the rest (the hops, the handler's own work, the answer).
  `--wakes` per example function (>= 20), `--load-wakes` per wake-fast/wake-slow (50);
  `wake_success_pct` is the share answered 200 within the function's timeout;
- **load step**: classify is deployed again (profiled first, as `faas-gpu up`'s background
  profile leaves it) and left idle, then 32 callers call it in a closed loop: the 504s of the
  step, and the seconds until the rate settles (first second from which every 2-second mean is
  within 15% of the last 10 seconds' mean).

- **broken rollout**: `rolling` (3 replicas, min = max = 3) under a closed loop of callers gets a
  version whose handler raises at import (an env setting); once `describe`'s rollout says Stalled,
  `faas-gpu rollback` restores it; `broken_rollout_failed_calls` is every call of the loop not
  answered 200, from before the broken deploy until the old version is settled again;
- **up unchanged**: `benchmarks/up_unchanged.py`'s `measure()`: `faas-gpu up` twice on a stack of
  its own (fresh state folder, free ports), the second offline; `up_unchanged_s` is the second.

Measurements are functions in `MEASUREMENTS`, each taking the running `Bench` and the arguments
and returning the figures it adds to the JSON; a new one is a function and a line there.
`--quick` is a short run of all of them (a check that it runs to the end, not figures).

Prints what it measures; the last line is one JSON object. The machine is shared: the figures are
this run's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import up_unchanged  # noqa: E402
from faas_gpu.contract import headers as h  # noqa: E402
from faas_gpu.http1 import Connection, ProtocolError  # noqa: E402
from tests.daemon_process import Daemon  # noqa: E402
from tests.stack_process import StackProcess  # noqa: E402

EXAMPLES = ("echo", "classify", "embed")
LOADING = {"wake-fast": 0.0, "wake-slow": 8.0}  # the synthetic model functions: seconds their handler loads
BODIES = {
    "echo": (b"hello", "text/plain"),
    "classify": (b'{"seed": 1}', "application/json"),
    "embed": (b'{"inputs": "a cold start"}', "application/json"),
    "wake-fast": (b'{"seed": 1}', "application/json"),
    "wake-slow": (b'{"seed": 1}', "application/json"),
}
TIMEOUT_S = {"echo": 30.0, "classify": 30.0, "embed": 60.0, "wake-fast": 60.0, "wake-slow": 60.0}
"""Each function's timeout (its exec_timeout): a wake-up answered 200 later than this is not a success."""
ZERO = {"com.openfaas.scale.zero": "true", "com.openfaas.scale.zero-duration": "30m"}
STEP_CLIENTS = 32
ROLLOUT_CLIENTS = 4
ROLLOUT_LABELS = {"com.openfaas.scale.min": "3", "com.openfaas.scale.max": "3"}
"""min = max = 3: the loop would otherwise scale it (CE's alert rule), which is not this measurement."""

ROLLING_HANDLER = """
import os

if os.environ.get("BROKEN"):
    raise RuntimeError("broken setting: BROKEN=" + os.environ["BROKEN"])


def handle(event, context):
    return "v" + os.environ.get("VERSION", "0")
"""

WAKE_MODEL = """
import torch
from torch import nn


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
"""

WAKE_HANDLER = """
import json
import os
import time

import torch

from faas_gpu import remote

from .model import make

time.sleep(float(os.environ.get("LOAD_SECONDS", "0")))  # a model that takes this long to load
model = remote(make())


def handle(event, context):
    seed = int(json.loads(event.body or b"{}").get("seed", 0))
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        y = model(x)
    return {"statusCode": 200, "body": {"class": int(y.argmax())}, "headers": {"Content-Type": "application/json"}}
"""


@dataclass
class Bench:
    """The running stack and its project folder."""

    root: Path
    home: Path
    stack: StackProcess
    daemons: list[Daemon] = field(default_factory=list)

    def cli(self, *args: str, check: bool = True) -> str:
        env = {**os.environ, "FAAS_GPU_HOME": str(self.home)}
        p = subprocess.run([sys.executable, "-m", "faas_gpu.cli", *args], cwd=self.root, env=env, capture_output=True)
        out = p.stdout.decode() + p.stderr.decode()
        if check and p.returncode != 0:
            raise RuntimeError(f"faas-gpu {' '.join(args)}: {out[-3000:]}")
        return out

    def deploy(self, *names: str) -> None:
        for name in names:
            self.cli("deploy", "-f", "stack.yml", "--gateway", self.stack.url, "--filter", name)
        for name in names:
            self.stack.wait_ready(name, timeout_s=180)

    def status(self, name: str) -> dict:
        r = requests.get(f"{self.stack.provider_url}/system/function/{name}", auth=self.stack.auth, timeout=10)
        r.raise_for_status()
        return r.json()

    def to_zero(self, name: str, timeout_s: float = 60.0) -> None:
        """`replicas: 0` on the provider API (a scale-zero function's, as OpenFaaS Pro's idler asks),
        then until no replica of it is left. Asked again every 5 s, as the idler does: a call of the
        last seconds is still in INFless's rate window, which plans an instance for it again."""
        deadline = time.monotonic() + timeout_s
        asked = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() - asked >= 5.0:
                r = requests.post(
                    f"{self.stack.provider_url}/system/scale-function/{name}",
                    json={"serviceName": name, "replicas": 0},
                    auth=self.stack.auth,
                    timeout=10,
                )
                if r.status_code not in (200, 202):
                    raise RuntimeError(f"scale {name} to 0: {r.status_code} {r.text.strip()}")
                asked = time.monotonic()
            if not self.instances(name) and self.status(name).get("availableReplicas", 0) == 0:
                return
            time.sleep(0.1)
        left = self.status(name).get("availableReplicas")
        raise RuntimeError(
            f"{name} did not reach zero within {timeout_s:.0f}s: instances {self.instances(name)}, "
            f"availableReplicas {left}"
        )

    def remove(self, name: str) -> None:
        url = f"{self.stack.url}/system/functions"
        requests.delete(url, json={"functionName": name}, auth=self.stack.auth, timeout=30)

    def instances(self, name: str) -> list:
        url = f"{self.stack.provider_url}/system/function/{name}/instances"
        r = requests.get(url, auth=self.stack.auth, timeout=10)
        return r.json().get("instances", []) if r.status_code == 200 else []


def project(root: Path) -> None:
    """echo, classify and embed as stack.yml has them, and the two wake functions, all scale-zero."""
    for name in EXAMPLES:
        shutil.copytree(REPO / "functions" / name, root / name, ignore=shutil.ignore_patterns("*.pt", "__pycache__"))
    (root / "wake").mkdir()
    (root / "wake" / "__init__.py").write_text("")
    (root / "wake" / "model.py").write_text(WAKE_MODEL)
    (root / "wake" / "handler.py").write_text(WAKE_HANDLER)
    (root / "wake" / "requirements.txt").write_text("")
    (root / "rolling").mkdir()
    (root / "rolling" / "handler.py").write_text(ROLLING_HANDLER)
    (root / "rolling" / "requirements.txt").write_text("")
    examples = yaml.safe_load((REPO / "stack.yml").read_text())["functions"]
    functions = {}
    for name in EXAMPLES:
        fn = dict(examples[name])
        fn["handler"] = f"./{name}"
        fn["image"] = f"bench/{name}:latest"
        fn["labels"] = {**(fn.get("labels") or {}), **ZERO}
        fn.setdefault("environment", {})["exec_timeout"] = f"{TIMEOUT_S[name]:g}s"
        functions[name] = fn
    for name, load_s in LOADING.items():
        functions[name] = {
            "lang": "python3-gpu",
            "handler": "./wake",
            "image": "bench/wake:latest",
            "labels": {**ZERO, "com.openfaas.scale.max": "2"},
            "annotations": {"com.faas-gpu.model": "wake-mlp", "com.faas-gpu.slo-ms": "500"},
            "environment": {"LOAD_SECONDS": f"{load_s:g}", "exec_timeout": f"{TIMEOUT_S[name]:g}s"},
        }
    functions["rolling"] = {
        "lang": "python3-gpu",
        "handler": "./rolling",
        "image": "bench/rolling:latest",
        "labels": ROLLOUT_LABELS,
        "environment": {"VERSION": "1"},
    }
    stack = {"version": 1.0, "provider": {"name": "openfaas"}, "functions": functions}
    (root / "stack.yml").write_text(yaml.safe_dump(stack, sort_keys=False))


# -- calls ---------------------------------------------------------------------------------------
def _seconds(headers: dict[str, str], name: str) -> float:
    try:
        return float(headers.get(name.lower()) or 0.0)
    except ValueError:
        return 0.0


def call(bench: Bench, name: str, timeout_s: float = 120.0) -> dict:
    """One call to `name`, timed, with the parts of its time its answer names."""
    body, ctype = BODIES[name]
    t0 = time.perf_counter()
    try:
        url = f"{bench.stack.url}/function/{name}"
        r = requests.post(url, data=body, headers={"Content-Type": ctype}, timeout=timeout_s)
        status, headers, text = r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.text
    except requests.RequestException as exc:
        status, headers, text = 0, {}, str(exc)
    total = time.perf_counter() - t0
    parts = {
        "replica_start": _seconds(headers, h.COLD_START_SECONDS),
        "upload": _seconds(headers, h.UPLOAD_SECONDS),
        "model_load": _seconds(headers, h.LOAD_SECONDS),
        "first_batch": _seconds(headers, h.EXECUTE_SECONDS),
    }
    parts["other"] = max(0.0, total - sum(parts.values()))
    return {"status": status, "total": total, "parts": parts, "text": text[:200] if status != 200 else ""}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


# -- measurements ------------------------------------------------------------------------------
def wake_ups(bench: Bench, args: argparse.Namespace) -> dict:
    """Each function taken to zero and called, `--wakes` times (`--load-wakes` for the wake
    functions): p50/p99 of the call's time, and where it went."""
    plan = {name: args.wakes for name in EXAMPLES} | {name: args.load_wakes for name in LOADING}
    plan = {name: n for name, n in plan.items() if n > 0 and (not args.only or name in args.only)}
    bench.deploy(*plan)
    for name in plan:  # the first call after the deploy: the model's first export, upload and load
        first = call(bench, name)
        print(f"{name}: first call after deploy {first['status']} in {first['total']:.2f}s {_parts(first)}", flush=True)
    out: dict = {"p50_s": {}, "p99_s": {}, "split_p50_s": {}, "answered": {}, "failures": {}}
    ok_total = calls_total = 0
    for name, n in plan.items():
        results = []
        for _ in range(n):
            bench.to_zero(name)
            results.append(call(bench, name))
        ok = [r for r in results if r["status"] == 200 and r["total"] <= TIMEOUT_S[name]]
        ok_total += len(ok)
        calls_total += len(results)
        totals = [r["total"] for r in results]
        out["p50_s"][name] = round(pct(totals, 50), 3)
        out["p99_s"][name] = round(pct(totals, 99), 3)
        out["split_p50_s"][name] = {
            part: round(statistics.median(r["parts"][part] for r in results), 3) for part in results[0]["parts"]
        }
        out["answered"][name] = f"{len(ok)}/{len(results)}"
        failures = Counter(f"{r['status']} {r['text'][:80]}" for r in results if r not in ok)
        if failures:
            out["failures"][name] = dict(failures)
        print(
            f"{name}: {len(ok)}/{len(results)} answered 200 within {TIMEOUT_S[name]:g}s; p50 {out['p50_s'][name]}s "
            f"p99 {out['p99_s'][name]}s; median split {out['split_p50_s'][name]}",
            flush=True,
        )
    return {
        "wake_success_pct": round(100.0 * ok_total / calls_total, 2) if calls_total else None,
        "wake_p99_s": out["p99_s"],
        "wake_p50_s": out["p50_s"],
        "wake_split_p50_s": out["split_p50_s"],
        "wake_answered": out["answered"],
        "wake_failures": out["failures"],
    }


def _parts(r: dict) -> str:
    return " ".join(f"{k}={v:.2f}" for k, v in r["parts"].items())


def load_step(bench: Bench, args: argparse.Namespace) -> dict:
    """Idle to 32 callers on a freshly deployed classify: the step's 504s and its time to settle;
    first with the instance's batch bound off (`FAAS_GPU_BATCH_BOUND=off`: each instance batches
    only to its planned size, as before issue 46), the same-run baseline, then as deployed."""
    if args.step_seconds <= 0:
        return {}
    # a noisy profile is stored too (marked so): the planner has one either way
    print(bench.cli("profile", "-f", "stack.yml", "classify", "--threads", "1", "--repeat", "3", check=False)[-400:])
    spec = yaml.safe_load((bench.root / "stack.yml").read_text())
    off = dict(spec["functions"]["classify"])
    off["environment"] = {**off.get("environment", {}), "FAAS_GPU_BATCH_BOUND": "off"}
    spec["functions"]["classify-unbound"] = off
    (bench.root / "stack.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out: dict = {}
    for name, prefix in (("classify-unbound", "load_step_unbound_"), ("classify", "load_step_")):
        step = one_step(bench, args, name)
        out.update({prefix + k: v for k, v in step.items()})
    return out


def one_step(bench: Bench, args: argparse.Namespace, name: str) -> dict:
    bench.remove(name)
    time.sleep(1.0)
    bench.deploy(name)
    BODIES.setdefault(name, BODIES["classify"])
    call(bench, name)  # the model on its unit: what a deployed, idle function has
    time.sleep(args.step_idle)
    plans: list[tuple[float, list]] = []
    watching = threading.Event()

    def watch() -> None:  # the planner's plan, once a second: when it first follows the step
        t0 = time.monotonic()
        while not watching.wait(1.0):
            plans.append((round(time.monotonic() - t0), [i.get("batch") for i in bench.instances(name)]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        per_second, codes = closed_loop(f"{bench.stack.url}/function/{name}", STEP_CLIENTS, args.step_seconds)
    finally:
        watching.set()
        watcher.join()
    bench.remove(name)
    first_plan = plans[0][1] if plans else None
    replanned = next((t for t, p in plans if p != first_plan), None)
    rates = [n for n, _, _ in per_second]
    settle = settled_at(rates)
    print(f"{name} step: per second {rates}", flush=True)
    print(f"{name} step: 504s per second {[m for _, m, _ in per_second]}", flush=True)
    print(f"{name} step: mean batch per second {[b for _, _, b in per_second]}", flush=True)
    print(f"{name} step: codes {dict(codes)}; settled after {settle}s", flush=True)
    print(f"{name} step: the plan's batches, second by second {[p for _, p in plans]}", flush=True)
    return {
        "504s": codes.get(504, 0),
        "settle_s": settle,
        "codes": {str(k): v for k, v in codes.items()},
        "rps_last10": round(statistics.mean(rates[-10:]), 1) if rates else None,
        "first5_rps": rates[:5],
        "first5_batch": [b for _, _, b in per_second[:5]],
        "replanned_s": replanned,
    }


def closed_loop(url: str, clients: int, seconds: float) -> tuple[list[tuple[int, int, float]], Counter]:
    """`clients` callers each calling in a loop over one kept-alive connection: (answers, 504s, the
    mean batch their answers ran in) per second, and the count of each status."""
    start = time.monotonic()
    stop = start + seconds
    buckets = [[0, 0] for _ in range(int(seconds) + 1)]
    batches: list[list[int]] = [[] for _ in buckets]
    codes: Counter = Counter()
    lock = threading.Lock()
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    host, port = netloc.rsplit(":", 1)
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    body, _ = BODIES["classify"]

    def caller() -> None:
        conn = Connection(host, int(port), timeout=60)
        while time.monotonic() < stop:
            batch = 0
            try:
                answer = conn.request("POST", path, {"Content-Type": "application/json"}, body)
                status, batch = answer.status, int(answer.header(h.BATCH) or 0)
                if answer.will_close:
                    conn.close()
            except (OSError, ProtocolError, ValueError):
                status = 0
                conn.close()
            at = min(int(time.monotonic() - start), len(buckets) - 1)
            with lock:
                codes[status] += 1
                buckets[at][0] += status == 200
                buckets[at][1] += status == 504
                batches[at].append(batch)
        conn.close()

    threads = [threading.Thread(target=caller) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mean_batch = [round(statistics.mean(b), 1) if b else 0 for b in batches[: int(seconds)]]
    return [(a, b, m) for (a, b), m in zip(buckets[: int(seconds)], mean_batch, strict=True)], codes


def settled_at(rates: list[int], band: float = 0.15) -> float | None:
    """The first second from which every 2-second mean stays within `band` of the last 10 seconds' mean."""
    if len(rates) < 12:
        return None
    final = statistics.mean(rates[-10:])
    if final <= 0:
        return None
    means = [(rates[i] + rates[i + 1]) / 2 for i in range(len(rates) - 1)]
    for start in range(len(means)):
        if all(abs(m - final) <= band * final for m in means[start:]):
            return float(start)
    return None


def broken_rollout(bench: Bench, args: argparse.Namespace) -> dict:
    """A broken version over three good replicas under load, then `faas-gpu rollback`: every call
    of the loop not answered 200, and how long the stall and the rollback took."""
    bench.deploy("rolling")
    bench.stack.wait_ready("rolling", timeout_s=180, replicas=3)
    spec = yaml.safe_load((bench.root / "stack.yml").read_text())
    broken = dict(spec["functions"]["rolling"])
    broken["environment"] = {"VERSION": "2", "BROKEN": "yes"}
    (bench.root / "broken.yml").write_text(yaml.safe_dump({**spec, "functions": {"rolling": broken}}))
    failed: Counter = Counter()
    ok = [0]
    stop = threading.Event()
    lock = threading.Lock()

    def caller() -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                r = session.post(f"{bench.stack.url}/function/rolling", data=b"x", timeout=60)
                code = r.status_code
                text = r.text[:80] if code != 200 else ""
            except requests.RequestException as exc:
                code, text = 0, str(exc)[:80]
            with lock:
                if code == 200:
                    ok[0] += 1
                else:
                    failed[f"{code} {text}"] += 1

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(ROLLOUT_CLIENTS)]
    for t in threads:
        t.start()
    stalled_s = restored_s = None
    try:
        time.sleep(2.0)
        t0 = time.monotonic()
        bench.cli("deploy", "-f", "broken.yml", "--gateway", bench.stack.url)
        deadline = t0 + 120
        while time.monotonic() < deadline:
            if (bench.status("rolling").get("faasGpuRollout") or {}).get("state") == "Stalled":
                stalled_s = round(time.monotonic() - t0, 2)
                break
            time.sleep(0.2)
        t1 = time.monotonic()
        bench.cli("rollback", "rolling", "--gateway", bench.stack.url)
        while time.monotonic() < t1 + 60:
            st = bench.status("rolling")
            if (
                "faasGpuRollout" not in st
                and st.get("availableReplicas") == 3
                and st.get("envVars", {}).get("VERSION") == "1"
            ):
                restored_s = round(time.monotonic() - t1, 2)
                break
            time.sleep(0.2)
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(70)
    bench.remove("rolling")
    failures = sum(failed.values())
    print(
        f"broken rollout: {ok[0]} calls answered 200, {failures} not {dict(failed)}; stalled after {stalled_s}s, "
        f"rolled back in {restored_s}s",
        flush=True,
    )
    return {
        "broken_rollout_failed_calls": failures,
        "broken_rollout_ok_calls": ok[0],
        "broken_rollout_stalled_s": stalled_s,
        "broken_rollout_restored_s": restored_s,
    }


def up_unchanged_stack(bench: Bench, args: argparse.Namespace) -> dict:
    """`faas-gpu up` of an unchanged stack, offline: `benchmarks/up_unchanged.py`'s measurement
    (its own state folder and ports, beside this benchmark's stack)."""
    out = up_unchanged.measure()
    print(f"up: first {out['up_first_s']}s, unchanged (offline) {out['up_unchanged_s']}s; rebuilt {out['rebuilt']}")
    return {"up_unchanged_s": out["up_unchanged_s"], "up_first_s": out["up_first_s"], "up_rebuilt": out["rebuilt"]}


MEASUREMENTS: dict[str, Callable[[Bench, argparse.Namespace], dict]] = {
    "wake_ups": wake_ups,
    "load_step": load_step,
    "broken_rollout": broken_rollout,
    "up_unchanged": up_unchanged_stack,
}
"""Each measurement's figures are merged into the JSON line, in this order."""

KEYS = (
    "wake_success_pct",
    "wake_p99_s",
    "broken_rollout_failed_calls",
    "load_step_504s",
    "load_step_settle_s",
    "up_unchanged_s",
)
"""The figures issue 46 asks of this benchmark's JSON line: always there (null when a measurement was
skipped or did not reach them)."""


def run(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="faas-gpu-cold-start-"))
    home = root / ".faas-gpu"
    home.mkdir()
    project(root)
    manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "1024", "--node", "local")
    scheduler = Daemon("scheduler", home)
    stack = StackProcess(home, "--scheduler", scheduler.url, "--cpus", "2", "--autoscale-period", "0.5").start()
    bench = Bench(root, home, stack, [manager, scheduler])
    out: dict = {"benchmark": "cold_start"}
    try:
        t0 = time.monotonic()
        bench.cli("build", "-f", "stack.yml")
        print(f"built in {time.monotonic() - t0:.1f}s", flush=True)
        for name, measure in MEASUREMENTS.items():
            if args.skip and name in args.skip:
                continue
            out.update(measure(bench, args))
    finally:
        stack.stop()
        scheduler.kill()
        manager.kill()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    for key in KEYS:
        out.setdefault(key, None)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wakes", type=int, default=20, help="wake-ups of each of echo, classify and embed (default 20)")
    p.add_argument("--load-wakes", type=int, default=50, help="wake-ups of wake-fast and wake-slow (default 50)")
    p.add_argument("--only", nargs="*", help="only these functions' wake-ups")
    p.add_argument("--step-seconds", type=float, default=40.0, help="the load step's length (0: none)")
    p.add_argument("--step-idle", type=float, default=5.0, help="idle seconds before the step")
    p.add_argument("--skip", nargs="*", choices=list(MEASUREMENTS), help="measurements to leave out")
    p.add_argument("--keep", action="store_true", help="keep the project and state folder (logs)")
    p.add_argument("--quick", action="store_true", help="2 wake-ups each, a 15 s step: that it runs to the end")
    args = p.parse_args()
    if args.quick:
        args.wakes, args.load_wakes, args.step_seconds, args.step_idle = 2, 2, 15.0, 2.0
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
