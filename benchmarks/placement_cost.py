"""Cost of one placement decision, per policy, by cluster size and queue length.

For U units (8 GB each, two Table I models cached per unit) and Q queued requests over a
100-model working set, every unit is busy but one; each measured decision completes that unit's
job and asks the policy to place work on it (`complete` + `schedule`), then the request it took
is re-queued so the queue stays at Q. The baseline is LB, measured in the same run.

Prints microseconds per decision and the ratio to LB, and as its last line one JSON object with
keys `<policy>_units<U>_queued<Q>_us`. Goal: <= 50 us per placement at 1000 units, 10,000 queued.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.policies import Model, ModelCache, Request, Unit, make_scheduler  # noqa: E402
from faas_gpu.sim.scenario import GPU_FAAS_TABLE1  # noqa: E402

UNITS = (12, 100, 1000)
QUEUED = (100, 10_000)
POLICIES = ("lb", "lalb", "lalb_o3")
N_MODELS = 100


def catalog() -> dict[str, Model]:
    out = {}
    for i in range(N_MODELS):
        name, size, load, infer = GPU_FAAS_TABLE1[i % len(GPU_FAAS_TABLE1)]
        out[f"{name}#{i}"] = Model(f"{name}#{i}", size, load, infer)
    return out


def measure(policy: str, n_units: int, n_queued: int, decisions: int, seed: int = 7) -> float:
    rng = random.Random(seed)
    models = catalog()
    names = list(models)
    units = [Unit(id=i, cache=ModelCache(8192)) for i in range(n_units)]
    sched = make_scheduler(policy, units, models)
    now = 0.0
    # warm: every unit caches two models and runs a job
    for u in units:
        for m in rng.sample(names, 2):
            u.cache.load(m, models[m].size_mb)
            sched.holders.setdefault(m, set()).add(u.id)
    rid = 0
    for u in units:
        sched.submit(Request(rid, u.cache.models[-1], now), now)
        rid += 1
    sched.schedule(now)
    for _ in range(n_queued):
        sched.submit(Request(rid, rng.choice(names), now), now)
        rid += 1
    busy = [u.id for u in units if not u.idle]
    elapsed = 0.0
    for _ in range(decisions):
        now += 0.01
        unit_id = rng.choice(busy)
        if sched.units[unit_id].idle:
            continue
        t0 = time.perf_counter()
        sched.complete(unit_id, now)
        placed = sched.schedule(now)
        elapsed += time.perf_counter() - t0
        for d in placed:  # keep the queue at its size
            if d.unit not in busy:
                busy.append(d.unit)
            sched.submit(Request(rid, rng.choice(names), now), now)
            rid += 1
    return elapsed / decisions * 1e6


def main() -> int:
    fig: dict[str, float] = {}
    print(f"{'units':>6} {'queued':>7} " + " ".join(f"{p + ' us':>12}" for p in POLICIES) + "   ratio to lb")
    for n_units in UNITS:
        for n_queued in QUEUED:
            row = {}
            for policy in POLICIES:
                decisions = 2000 if n_units * n_queued < 1_000_000 else 1000
                row[policy] = measure(policy, n_units, n_queued, decisions)
                fig[f"{policy}_units{n_units}_queued{n_queued}_us"] = round(row[policy], 2)
            ratios = " ".join(f"{row[p] / row['lb']:.1f}x" for p in POLICIES[1:])
            print(f"{n_units:>6} {n_queued:>7} " + " ".join(f"{row[p]:>12.2f}" for p in POLICIES) + f"   {ratios}")
    worst = max(fig[f"{p}_units1000_queued10000_us"] for p in POLICIES)
    print(f"worst at 1000 units, 10,000 queued: {worst:.1f} us (goal <= 50 us)")
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
