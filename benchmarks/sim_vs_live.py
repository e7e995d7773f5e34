"""The simulator against the live stack on one trace (issue 45): `faas-gpu replay` with its figures.

The trace (default: INFless's four Azure 2019 functions, `../shared/data/infless/workload/
azure_7day_per_minute/{1..4}.txt`, taken again at other minutes for a working set of 6) is replayed
for `--minutes` (10), compressed `--compress` times (5: two minutes a policy), at a mean of
`--mean-rate` requests/s (1.0), through LB, LALB and LALB-O3: each on a fresh `faas-gpu up` on the
cpu back end (2 units of 80 MB; models of 8, 16 and 24 MB, real torch.export MLPs) and through the
simulator with the same arrivals, units, caches at the start, and the service times the live units
measured in that run (`faas_gpu/cli/replay.py` says what is measured and what is not simulated).
Then INFless's keep-alive, LSTH against HHP: the trace's own functions (the four, as Fig. 16) over
60 minutes as recorded (392 invocations), compressed 20 times, on one more stack whose provider's
keep-alive clock runs 20 times the wall's, each function deployed once per policy (taken to zero
when idle) and every request sent to both; the simulator's side is the Fig. 16 replay of the same
minutes.

Printed: `faas-gpu replay`'s notes, measured profiles and side-by-side table; the machine's load
(`os.getloadavg`, 1-minute) before and after, since the cpu back end's units share the host's CPUs
with every other process; and, as the last line, one JSON object: the replay's figures,
`sim_over_live_<policy>_<figure>` for each ratio (placement: mean and P99 latency, SLO misses, cold
starts, hit and miss ratio; keep-alive: cold starts, cold-start rate, idle minutes),
`same_policy_order` (both sides rank LB / LALB / LALB-O3 alike, and LSTH / HHP), `within_20pct`
(placement: mean latency and miss ratio within ±20% for every policy), `load_avg_start` /
`load_avg_end` and `wall_s`.

    .venv/bin/python benchmarks/sim_vs_live.py [--trace FILE ...] [--quick] [replay flags ...]

`--quick` (for tests): one policy (lalb), 2 trace minutes compressed 12 times, 2 functions.
Any other flag is passed to `faas-gpu replay` (`--units`, `--unit-memory-mb`, `--model-mb`,
`--slo-ms`, `--working-set`, ...), after the defaults, so it wins.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.paths import SHARED_DATA  # noqa: E402

AZURE = SHARED_DATA / "infless" / "workload" / "azure_7day_per_minute"
DEFAULTS = [
    "--minutes", "10", "--compress", "5", "--mean-rate", "1.0",
    "--working-set", "6", "--reuse-functions",
    "--units", "2", "--unit-memory-mb", "80", "--model-mb", "8,16,24",
    "--policies", "lb,lalb,lalb_o3,lsth,hhp", "--keepalive-minutes", "60", "--keepalive-compress", "20",
]  # fmt: skip
QUICK = [
    "--minutes", "2", "--compress", "12", "--policies", "lalb", "--working-set", "2",
    "--units", "1", "--unit-memory-mb", "16", "--model-mb", "4,8", "--rows", "2",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, action="append", help="trace file(s) (default: INFless's Azure 1-4)")
    p.add_argument("--quick", action="store_true", help="one policy, two minutes: a check that it runs")
    p.add_argument(
        "--out", type=Path, default=Path("sim-vs-live-out"), help="the replay's outcomes (default sim-vs-live-out)"
    )
    args, passed = p.parse_known_args(argv)
    traces = args.trace or [AZURE / f"{i}.txt" for i in (1, 2, 3, 4)]
    missing = [t for t in traces if not t.is_file()]
    if missing:
        print(f"sim_vs_live: {missing[0]} not found (give --trace FILE)", file=sys.stderr)
        return 2
    argv_replay = [*map(str, traces), *(QUICK if args.quick else DEFAULTS), "--out", str(args.out), *passed]
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    print(f"faas-gpu replay {' '.join(argv_replay)}", file=sys.stderr, flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", "replay", *argv_replay],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    try:  # a part that failed leaves the others' figures, and says so ("failed")
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        print(proc.stdout, end="")
        print(f"sim_vs_live: faas-gpu replay exited {proc.returncode}", file=sys.stderr)
        return proc.returncode or 1
    print("\n".join(lines[:-1]))
    load_end = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPUs, 1-minute load average {load_start:.1f} at the start, {load_end:.1f} at the "
        f"end (the cpu back end's units share them with every other process); {wall:.0f} s in all"
    )
    result.update(
        cpus=os.cpu_count(), load_avg_start=round(load_start, 2), load_avg_end=round(load_end, 2), wall_s=round(wall, 1)
    )
    print(json.dumps(result))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
