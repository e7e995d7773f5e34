"""PROTEAN's request classes live: an open-loop overload, class-blind vs strict / best-effort.

The real stack on this machine, no GPU: a GPU Manager on the `sim` back end (`--units` units, each
job `--job-ms` at batch 1, from a profile file in INFless's format), the scheduler daemon (its placement
policy behind PROTEAN's `ClassQueue`: strict jobs earliest deadline first, best-effort jobs
behind them for at most `--be-max-wait`), the gateway/provider stack, and the classify example built and
deployed with `faas-gpu build` / `deploy` at `com.faas-gpu.max-batch: 1`, as in
tests/e2e/test_protean_e2e.py.

Load: one Poisson arrival schedule (seeded), `--rps` for `--seconds`, sent open-loop (each request
at its scheduled time, from a thread pool with a thread per request at most, so sending never
waits for an answer), then drained. The default is 26 req/s on 2 units of 100 ms: 1.3x the back
end's capacity of 20 jobs/s, so a backlog grows by ~6 jobs/s for the whole run. Latency is taken
from the scheduled send time (no coordinated omission). Two phases in the same run, on the same
stack and the same schedule:
  (a) baseline, class-blind: every request strict with the same SLO (X-Faas-Gpu-Slo-Ms), so the
      scheduler's earliest-deadline-first order is arrival order: FIFO;
  (b) PROTEAN: the same schedule, every other request `X-Faas-Gpu-Class: best-effort`, the others
      strict with that SLO.

SLO: 1,000 ms by default: ten times a job (the latency a strict request may spend queued behind
others), well above what the stack itself adds here (tens of ms: see the unloaded latency
printed), and far below the backlog a class-blind queue builds up in 20 s of 1.3x overload
(~6 jobs/s x 20 s = 120 jobs, 6 s at 20 jobs/s). The strict half alone is 0.65x capacity, so in
(b) it can meet the SLO only if strict work overtakes best-effort work; the best-effort half then
carries the whole excess.

`--be-max-wait` and `--be-share` are the scheduler's (defaults 5 s and 0.25, the daemon's): a
best-effort job that has waited `--be-max-wait` takes at most `--be-share` of the admissions
while strict jobs wait. `--be-share 1` serves an overdue best-effort job before any strict one,
which under an overload that outlasts the bound hands strict work's capacity to best-effort work.

Placement (`--policy`) is the daemon's default, `lalb_o3`: the class queue admits a model load
time of queued work per unit, which LALB needs to see before it loads a busy model on a second
unit, so a strict job waits behind up to about that much admitted work (its P50 shows it).
`--policy lb` (every idle unit takes the head of what is admitted) has no such wait.
Each phase prints the jobs/s it was served at and the units that ran them, to check the capacity.

Concurrency limits are raised so that nothing but the scheduler's queue orders requests: gateway
threads (`--threads`), the watchdog's handler threads (`handler_threads`), the function client's
batches in flight (`FAAS_GPU_MAX_INFLIGHT`, 32 by default, whose wait is FIFO) and the scheduler's
HTTP threads. The first call (model upload and load) and a warm-up of every unit come first.

Printed: per phase and class, count, P50 / P99 latency (ms), SLO compliance (strict), errors; the
ratio of strict P99 (b) / (a); strict SLO % (b) vs (a). Last line: one JSON object of figures.

    .venv/bin/python benchmarks/protean_live.py [--seconds 20 --rps 26 --units 2 --job-ms 100 --slo-ms 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.daemon_process import Daemon  # noqa: E402
from tests.stack_process import StackProcess  # noqa: E402

FUNCTION = "classify"
STRICT, BEST_EFFORT = "strict", "best-effort"
HTTP_THREADS = 512  # gateway, watchdog handler, function client and scheduler: above any backlog here


@dataclass
class Outcome:
    klass: str
    latency_s: float  # from the scheduled send time
    lag_s: float  # actual send time - scheduled send time
    status: int | str
    done_s: float = 0.0  # answer time, from the phase's start
    unit: str | None = None  # the unit that ran it (X-Faas-Gpu-Unit)


def arrivals(rps: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times (s from the start) of one phase."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rps)
        if t >= seconds:
            return out
        out.append(t)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Bench:
    """The stack's processes; `close` stops every one of them, whatever was started."""

    def __init__(self, root: Path, args: argparse.Namespace):
        self.root, self.args = root, args
        self.home = root / ".faas-gpu"
        self.daemons: list[Daemon] = []
        self.stack: StackProcess | None = None

    def _daemon(self, module: str, *argv: str) -> Daemon:
        d = Daemon.__new__(Daemon)  # kept before it is started, so a start that fails is still stopped
        self.daemons.append(d)
        d.__init__(module, self.home, *argv)
        return d

    def start(self) -> str:
        a = self.args
        self.home.mkdir()
        profile = self.root / "sim-profile.txt"
        profile.write_text("".join(f"bench 8 50 {b} {a.job_ms:g}\n" for b in (1, 2, 4, 8, 16, 32, 64)))
        shutil.copytree(REPO / "functions" / FUNCTION, self.root / FUNCTION, ignore=shutil.ignore_patterns("*.pt"))
        stack_file = {
            "version": 1.0,
            "provider": {"name": "openfaas"},
            "functions": {
                FUNCTION: {
                    "lang": "python3-gpu",
                    "handler": f"./{FUNCTION}",
                    "image": f"protean-bench/{FUNCTION}:latest",
                    "annotations": {"com.faas-gpu.slo-ms": f"{a.slo_ms:g}", "com.faas-gpu.max-batch": "1"},
                    "environment": {
                        "handler_threads": str(HTTP_THREADS),
                        "FAAS_GPU_MAX_INFLIGHT": str(HTTP_THREADS),
                        "write_timeout": "120s",
                        "exec_timeout": "120s",
                    },
                }
            },
        }
        (self.root / "stack.yml").write_text(yaml.safe_dump(stack_file))
        sim = ("--backend", "sim", "--sim-profile", str(profile), "--sim-load-s", "0.5")
        self._daemon("gpu_manager", *sim, "--units", str(a.units), "--node", "local")
        classes = ("--be-max-wait", f"{a.be_max_wait:g}", "--be-share", f"{a.be_share:g}")
        scheduler = self._daemon("scheduler", "--policy", a.policy, *classes, "--threads", str(HTTP_THREADS))
        self.stack = StackProcess(
            self.home,
            "--scheduler",
            scheduler.url,
            "--threads",
            str(HTTP_THREADS),
            "--max-inflight-per-function",  # one function under test: all but the reserve
            str(HTTP_THREADS),
        )
        self.stack.start()
        env = {**os.environ, "FAAS_GPU_HOME": str(self.home)}
        for cmd in (["build", "-f", "stack.yml"], ["deploy", "-f", "stack.yml", "--gateway", self.stack.url]):
            subprocess.run(
                [sys.executable, "-m", "faas_gpu.cli", *cmd],
                cwd=self.root,
                env=env,
                check=True,
                timeout=300,
                stdout=subprocess.DEVNULL,
            )
        self.stack.wait_ready(FUNCTION, timeout_s=120)
        return f"{self.stack.url}/function/{FUNCTION}"

    def close(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        for d in reversed(self.daemons):
            if getattr(d, "proc", None) is not None:
                d.kill(signal.SIGTERM)


def warm_up(url: str, units: int) -> tuple[set[str], float]:
    """The first call uploads the model and loads it; then bursts until every unit has run a job.
    Returns the units seen and the median latency of one request at a time (s), the floor."""
    r = requests.post(url, json={"seed": 0}, timeout=120)
    r.raise_for_status()
    seen = {r.headers.get("X-Faas-Gpu-Unit", "?")}
    with ThreadPoolExecutor(4 * units) as pool:
        for _ in range(10):
            if len(seen) >= units:
                break
            rs = list(pool.map(lambda n: requests.post(url, json={"seed": n}, timeout=120), range(4 * units)))
            for r in rs:
                r.raise_for_status()
                seen.add(r.headers.get("X-Faas-Gpu-Unit", "?"))
    alone = []
    for n in range(10):
        t = time.perf_counter()
        requests.post(url, json={"seed": n}, headers={"X-Faas-Gpu-Class": BEST_EFFORT}, timeout=120).raise_for_status()
        alone.append(time.perf_counter() - t)
    return seen, percentile(alone, 0.5)


def run_phase(url: str, schedule: list[float], classes: list[str], slo_ms: float) -> list[Outcome]:
    """Send each request at its scheduled time (open loop) and wait for every answer."""
    local = threading.local()

    def send(i: int, at: float) -> Outcome:
        lag = time.perf_counter() - at
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        headers = {"X-Faas-Gpu-Class": classes[i]}
        if classes[i] == STRICT:
            headers["X-Faas-Gpu-Slo-Ms"] = f"{slo_ms:g}"
        unit = None
        try:
            r = session.post(url, json={"seed": i}, headers=headers, timeout=180)
            status: int | str = r.status_code
            unit = r.headers.get("X-Faas-Gpu-Unit")
        except requests.RequestException as exc:
            status = type(exc).__name__
        now = time.perf_counter()
        return Outcome(classes[i], now - at, lag, status, now - t0, unit)

    pool = ThreadPoolExecutor(max(1, len(schedule)), thread_name_prefix="sender")  # threads start lazily
    try:
        t0 = time.perf_counter() + 0.2
        futures = []
        for i, t in enumerate(schedule):
            delay = t0 + t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(send, i, t0 + t))
        wait(futures)
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def summary(outcomes: list[Outcome], klass: str, slo_ms: float) -> dict:
    mine = [o for o in outcomes if o.klass == klass]
    ok = [o.latency_s * 1000 for o in mine if o.status == 200]
    within = sum(1 for o in mine if o.status == 200 and o.latency_s * 1000 <= slo_ms)
    return {
        "count": len(mine),
        "p50_ms": percentile(ok, 0.50),
        "p99_ms": percentile(ok, 0.99),
        "slo_pct": 100.0 * within / len(mine) if mine else float("nan"),
        "errors": len(mine) - len(ok),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="arrivals per phase for this long")
    p.add_argument("--rps", type=float, default=26.0, help="offered load (Poisson)")
    p.add_argument("--units", type=int, default=2, help="sim units")
    p.add_argument("--job-ms", type=float, default=100.0, help="sim job time at batch 1")
    p.add_argument("--slo-ms", type=float, default=1000.0, help="strict requests' SLO")
    p.add_argument("--be-max-wait", type=float, default=5.0, help="scheduler: best-effort bound (s)")
    p.add_argument("--be-share", type=float, default=0.25, help="scheduler: overdue best-effort share")
    p.add_argument("--policy", choices=["lb", "lalb", "lalb_o3"], default="lalb_o3", help="scheduler: placement")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    capacity = args.units * 1000.0 / args.job_ms

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    schedule = arrivals(args.rps, args.seconds, args.seed)
    phases = {
        "baseline": [STRICT] * len(schedule),
        "protean": [BEST_EFFORT if i % 2 else STRICT for i in range(len(schedule))],
    }
    results: dict[str, list[Outcome]] = {}
    served: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="faas-gpu-protean-live-") as tmp:
        bench = Bench(Path(tmp), args)
        try:
            t_setup = time.perf_counter()
            url = bench.start()
            units_seen, alone_s = warm_up(url, args.units)
            print(
                f"stack up in {time.perf_counter() - t_setup:.0f} s; warm units: {', '.join(sorted(units_seen))}; "
                f"one request alone: {alone_s * 1000:.0f} ms (P50 of 10)",
                flush=True,
            )
            for name, classes in phases.items():
                t = time.perf_counter()
                results[name] = out = run_phase(url, schedule, classes, args.slo_ms)
                ok = [o for o in out if o.status == 200]
                served[name] = len(ok) / max(o.done_s for o in out)
                units = sorted({o.unit or "?" for o in ok})
                print(
                    f"phase {name}: {len(out)} requests answered in {time.perf_counter() - t:.1f} s, "
                    f"{served[name]:.1f} jobs/s on {len(units)} unit(s) ({', '.join(units)})",
                    flush=True,
                )
                time.sleep(1.0)
        finally:
            bench.close()

    print(
        f"\noffered {args.rps:g} req/s (Poisson, {len(schedule)} requests in {args.seconds:g} s) on "
        f"{args.units} sim unit(s) x {args.job_ms:g} ms = {capacity:g} jobs/s capacity "
        f"({args.rps / capacity:.2f}x); SLO {args.slo_ms:g} ms; "
        f"be-max-wait {args.be_max_wait:g} s, be-share {args.be_share:g}"
    )
    print(f"{'phase':<10}{'class':<13}{'count':>6}{'P50 ms':>10}{'P99 ms':>10}{'SLO %':>8}{'errors':>8}")
    rows = {}
    for name, outcomes in results.items():
        for klass in (STRICT, BEST_EFFORT):
            s = summary(outcomes, klass, args.slo_ms)
            if not s["count"]:
                continue
            rows[name, klass] = s
            slo = f"{s['slo_pct']:.1f}" if klass == STRICT else "-"
            print(
                f"{name:<10}{klass:<13}{s['count']:>6}{s['p50_ms']:>10.0f}{s['p99_ms']:>10.0f}{slo:>8}{s['errors']:>8}"
            )
    base, prot, be = rows["baseline", STRICT], rows["protean", STRICT], rows["protean", BEST_EFFORT]
    ratio = prot["p99_ms"] / base["p99_ms"]
    lag = max(o.lag_s for outcomes in results.values() for o in outcomes)
    print(f"strict P99 PROTEAN / class-blind: {prot['p99_ms']:.0f} / {base['p99_ms']:.0f} ms = x{ratio:.3f}")
    print(f"strict SLO compliance: {prot['slo_pct']:.1f}% (PROTEAN) vs {base['slo_pct']:.1f}% (class-blind)")
    print(f"largest send lag behind the schedule: {lag * 1000:.1f} ms")
    fig = {
        "baseline_strict_p50_ms": round(base["p50_ms"], 1),
        "baseline_strict_p99_ms": round(base["p99_ms"], 1),
        "protean_strict_p50_ms": round(prot["p50_ms"], 1),
        "protean_strict_p99_ms": round(prot["p99_ms"], 1),
        "protean_be_p50_ms": round(be["p50_ms"], 1),
        "protean_be_p99_ms": round(be["p99_ms"], 1),
        "baseline_strict_slo_pct": round(base["slo_pct"], 2),
        "protean_strict_slo_pct": round(prot["slo_pct"], 2),
        "strict_p99_ratio": round(ratio, 4),
        "errors": sum(s["errors"] for s in rows.values()),
        "requests_per_phase": len(schedule),
        "offered_rps": args.rps,
        "capacity_rps": capacity,
        "baseline_served_rps": round(served["baseline"], 2),
        "protean_served_rps": round(served["protean"], 2),
        "slo_ms": args.slo_ms,
        "unloaded_p50_ms": round(alone_s * 1000, 1),
        "be_max_wait_s": args.be_max_wait,
        "be_share": args.be_share,
        "max_send_lag_ms": round(lag * 1000, 1),
    }
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:  # the stack was stopped on the way out
        print(f"interrupted ({exc})", file=sys.stderr)
        sys.exit(130)
