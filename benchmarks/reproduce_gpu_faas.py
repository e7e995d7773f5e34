"""Reproduce the GPU-FaaS paper's placement results (§V, Fig. 4 and 7) in the simulator.

Set-up as the paper's: 12 GPUs (3 nodes x 4, 8 GB, RTX 2080), the 22 models of Table I
(GPU occupation, load and inference times at batch 32), 6 minutes of the Azure trace at a mean of
325 requests/minute, working sets 15, 25 and 35; LB vs LALB vs LALB-O3 (limit 25); and the O3 limit
sweep 0..45 at working set 35. Every figure is averaged over `--seeds` seeds (arrival times).

The trace is replayed as recorded, with two explicit choices from the scenario file (printed):
the working set reuses the four series at other start minutes (`reuse_functions`), and one scale
factor for every minute makes the mean 325/min (`mean_requests_per_minute`), so the recorded
minute-to-minute shape and the functions' shares are kept (before issue 18 every minute was
rescaled to exactly 325 and spread over all functions).

Curves (issue 18): the reductions above hold at the paper's load, where LB's queue grows all run.
The script also sweeps the load (mean requests/minute, 50-400, at working sets 15 and 35) and the
working set (15-100 at 325/min; past the trace's 4 functions the working set is formed by
`reuse_functions`, printed) and reports LB / LALB / LALB-O3 mean and P99 latency and miss ratio
along both (JSON keys `curve_load_*`, `curve_ws_*`), plus LALB-O3's gain over LALB at other start
minutes of the trace (`window_*`). The curves are drawn to `docs/figures/gpu_faas_load.png` and
`gpu_faas_working_set.png`, the paper's points starred (`--figures DIR` elsewhere; `--quick`
writes none unless asked).

Prints a table beside the paper's reductions vs LB, measured in the same run, and as its last
line one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.sim import load_scenario, simulate  # noqa: E402
from faas_gpu.sim.curves import Mark, Panel, Series, plot_panels  # noqa: E402
from faas_gpu.sim.trace import build_workload  # noqa: E402

SCENARIO = REPO / "faas_gpu" / "sim" / "scenarios" / "gpu_faas_ws15.yaml"
FIGURES = REPO / "docs" / "figures"
WORKING_SETS = (15, 25, 35)
POLICIES = ("lb", "lalb", "lalb_o3")
LABEL = {"lb": "LB", "lalb": "LALB", "lalb_o3": "LALB-O3"}
COLOR = {"lb": "tab:blue", "lalb": "tab:orange", "lalb_o3": "tab:green"}
PAPER_RPM = 325  # the paper's mean load, requests/minute
LOADS = (50, 100, 150, 200, 250, 300, 325, 350, 400)
LOAD_CURVE_WS = (15, 35)
CURVE_WORKING_SETS = (15, 25, 35, 50, 75, 100)
START_MINUTES = (0, 1440, 2880, 4320, 5760, 7200)  # one per day of the week-long trace
METRICS = ("avg_latency_s", "p99_latency_s", "miss_ratio")
# the paper's reductions vs LB, in % (Fig. 4a/4b and the text of §V-B)
PAPER = {
    ("lalb", 15): {"latency": 97.74, "miss": 94.11},
    ("lalb", 25): {"latency": 93.33, "miss": None},
    ("lalb", 35): {"latency": 79.43, "miss": 65.21},
    ("lalb_o3", 35): {"latency": 96.93, "miss": 81.16},
}


def run(
    ws: int, policy: str, seeds: list[int], o3_limit: int = 25, rpm: float = PAPER_RPM, start: int = 0
) -> dict[str, float]:
    """Means over seeds at working set `ws`, a mean load of `rpm` requests/minute from `start`."""
    scenario = load_scenario(SCENARIO)
    scenario.trace.working_set = ws
    scenario.trace.mean_requests_per_minute = rpm
    scenario.trace.start_minute = start
    runs = []
    for seed in seeds:
        scenario.seed = seed
        runs.append(simulate(scenario, policy, o3_limit).summary())
    return {
        k: statistics.mean(r[k] for r in runs)
        for k in (
            "avg_latency_s",
            "p99_latency_s",
            "miss_ratio",
            "false_miss_ratio",
            "avg_top_model_duplicates",
            "sm_utilization",
            "makespan_s",
        )
    }


def reduction(base: float, value: float) -> float:
    return 100.0 * (base - value) / base if base else 0.0


Curve = dict[str, dict[str, list[float]]]  # policy -> metric -> one value per point


def curve(points: list[dict[str, float]]) -> dict[str, list[float]]:
    keys = (*METRICS, "makespan_s")
    return {k: [p[k] for p in points] for k in keys}


def record_curve(fig: dict, prefix: str, res: Curve) -> None:
    """`<prefix>_<policy>_<metric>` lists, and LALB's / LALB-O3's latency and miss reductions vs LB."""
    for pol in POLICIES:
        for metric in METRICS:
            fig[f"{prefix}_{pol}_{metric}"] = [round(v, 4) for v in res[pol][metric]]
        if pol == "lb":
            fig[f"{prefix}_lb_makespan_s"] = [round(v, 1) for v in res[pol]["makespan_s"]]
            continue
        for metric, tag in (("avg_latency_s", "latency"), ("miss_ratio", "miss")):
            fig[f"{prefix}_{pol}_{tag}_reduction_pct"] = [
                round(reduction(b, v), 2) for b, v in zip(res["lb"][metric], res[pol][metric], strict=True)
            ]


def print_curve(title: str, xname: str, xs: list[int], res: Curve) -> None:
    print(f"\n{title}")
    print(
        f"{xname:>5} {'LB s':>8} {'LB P99':>8} {'LB miss':>8} {'LB end s':>8} {'LALB s':>8} {'P99':>7}"
        f" {'miss':>6} {'-% LB':>6} {'O3 s':>7} {'P99':>7} {'miss':>6} {'-% LB':>6}"
    )
    lb, la, o3 = res["lb"], res["lalb"], res["lalb_o3"]
    for i, x in enumerate(xs):
        print(
            f"{x:>5} {lb['avg_latency_s'][i]:>8.2f} {lb['p99_latency_s'][i]:>8.2f} {lb['miss_ratio'][i]:>8.3f}"
            f" {lb['makespan_s'][i]:>8.0f} {la['avg_latency_s'][i]:>8.2f} {la['p99_latency_s'][i]:>7.2f}"
            f" {la['miss_ratio'][i]:>6.3f} {reduction(lb['avg_latency_s'][i], la['avg_latency_s'][i]):>6.1f}"
            f" {o3['avg_latency_s'][i]:>7.2f} {o3['p99_latency_s'][i]:>7.2f} {o3['miss_ratio'][i]:>6.3f}"
            f" {reduction(lb['avg_latency_s'][i], o3['avg_latency_s'][i]):>6.1f}"
        )


def load_curves(fig: dict, seeds: list[int], loads: tuple[int, ...], working_sets: tuple[int, ...]) -> dict[int, Curve]:
    """LB / LALB / LALB-O3 along the mean load, at each of `working_sets`."""
    fig["curve_load_rpm"] = list(loads)
    out = {}
    for ws in working_sets:
        res = {pol: curve([run(ws, pol, seeds, rpm=rpm) for rpm in loads]) for pol in POLICIES}
        record_curve(fig, f"curve_load_ws{ws}", res)
        print_curve(
            f"Load sweep at working set {ws}: mean latency, P99 (s), miss ratio; 'LB end s' = when LB's last"
            " request finishes (the trace ends at 360 s: far beyond it, LB's queue grew all run)",
            "rpm",
            list(loads),
            res,
        )
        out[ws] = res
    return out


def working_set_curves(fig: dict, seeds: list[int], working_sets: tuple[int, ...]) -> Curve:
    """LB / LALB / LALB-O3 along the working set at the paper's load; how each set is formed is printed."""
    fig["curve_ws_working_sets"] = list(working_sets)
    for ws in working_sets:
        scenario = load_scenario(SCENARIO)
        scenario.trace.working_set = ws
        for note in build_workload(scenario.trace, scenario.models, scenario.seed).notes:
            if "reusing" in note:
                print(f"ws{ws}: {note}", file=sys.stderr)
    res = {pol: curve([run(ws, pol, seeds) for ws in working_sets]) for pol in POLICIES}
    record_curve(fig, "curve_ws", res)
    print_curve(f"Working-set sweep at {PAPER_RPM} requests/minute", "ws", list(working_sets), res)
    return res


def window_sensitivity(fig: dict, seeds: list[int], starts: tuple[int, ...], ws: int = 35) -> None:
    """LALB-O3's gain over LALB at other start minutes of the trace (it is large only under strain)."""
    print(f"\nLALB-O3 vs LALB at working set {ws}, {PAPER_RPM}/min, by the trace's start minute")
    print(f"{'start':>6} {'LALB s':>8} {'O3 s':>8} {'O3 -% vs LALB':>14} {'LALB miss':>10} {'O3 miss':>8}")
    la = [run(ws, "lalb", seeds, start=t) for t in starts]
    o3 = [run(ws, "lalb_o3", seeds, start=t) for t in starts]
    gains = [reduction(a["avg_latency_s"], b["avg_latency_s"]) for a, b in zip(la, o3, strict=True)]
    for t, a, b, g in zip(starts, la, o3, gains, strict=True):
        print(
            f"{t:>6} {a['avg_latency_s']:>8.2f} {b['avg_latency_s']:>8.2f} {g:>14.1f} {a['miss_ratio']:>10.3f}"
            f" {b['miss_ratio']:>8.3f}"
        )
    fig["window_start_minutes"] = list(starts)
    fig[f"window_ws{ws}_lalb_avg_latency_s"] = [round(a["avg_latency_s"], 4) for a in la]
    fig[f"window_ws{ws}_lalb_o3_avg_latency_s"] = [round(b["avg_latency_s"], 4) for b in o3]
    fig[f"window_ws{ws}_o3_vs_lalb_latency_reduction_pct"] = [round(g, 2) for g in gains]


def metric_panels(res: Curve, xs: list[int], xlabel: str, where: str, marks: dict[str, list[Mark]]) -> list[Panel]:
    """Mean and P99 latency, miss ratio, latency and miss reductions vs LB; the paper's points starred."""

    def series(metric: str, pols: tuple[str, ...] = POLICIES) -> list[Series]:
        return [Series(LABEL[p], xs, res[p][metric], COLOR[p]) for p in pols]

    def reductions(metric: str) -> list[Series]:
        return [
            Series(
                LABEL[p],
                xs,
                [reduction(b, v) for b, v in zip(res["lb"][metric], res[p][metric], strict=True)],
                COLOR[p],
            )
            for p in ("lalb", "lalb_o3")
        ]

    vline = PAPER_RPM if xlabel.startswith("mean") else None
    return [
        Panel(f"mean latency, {where}", xlabel, "s", series("avg_latency_s"), vline=vline, log_y=True),
        Panel(f"P99 latency, {where}", xlabel, "s", series("p99_latency_s"), vline=vline, log_y=True),
        Panel(f"miss ratio, {where}", xlabel, "misses / dispatches", series("miss_ratio"), vline=vline),
        Panel(f"latency cut vs LB, {where}", xlabel, "%", reductions("avg_latency_s"), marks["latency"], vline),
        Panel(f"miss cut vs LB, {where}", xlabel, "%", reductions("miss_ratio"), marks["miss"], vline),
    ]


def paper_marks(x_of: dict[int, float]) -> dict[str, list[Mark]]:
    """The paper's reductions vs LB at the points `x_of` maps its working sets to."""
    out: dict[str, list[Mark]] = {"latency": [], "miss": []}
    for (pol, ws), figures in PAPER.items():
        if ws not in x_of:
            continue
        for key in ("latency", "miss"):
            if figures[key] is not None:
                out[key].append(Mark(x_of[ws], figures[key], f"{LABEL[pol]} ws{ws}"))
    return out


def plot(loads: dict[int, Curve], load_xs: list[int], by_ws: Curve, ws_xs: list[int], folder: Path) -> list[Path]:
    panels = []
    for ws, res in loads.items():
        panels += metric_panels(res, load_xs, "mean requests/minute", f"ws{ws}", paper_marks({ws: PAPER_RPM}))
    files = [
        plot_panels(
            folder / "gpu_faas_load.png",
            panels,
            "GPU-FaaS in the simulator: LB / LALB / LALB-O3 along the load (12 GPUs x 8 GB, 6 min of the trace)",
            ncols=5,
        )
    ]
    ws_marks = paper_marks({ws: ws for ws in WORKING_SETS})
    files.append(
        plot_panels(
            folder / "gpu_faas_working_set.png",
            metric_panels(by_ws, ws_xs, "working set (models)", f"{PAPER_RPM}/min", ws_marks),
            f"GPU-FaaS in the simulator: along the working set at {PAPER_RPM} requests/minute",
            ncols=5,
        )
    )
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--quick", action="store_true", help="CI size: 2 seeds, 4 loads, 3 working sets, 2 start minutes, no figures"
    )
    p.add_argument(
        "--figures", type=Path, default=None, help=f"folder for the PNG curves (default {FIGURES}; none with --quick)"
    )
    args = p.parse_args(argv)
    seeds = list(range(1, (min(args.seeds, 2) if args.quick else args.seeds) + 1))
    figures = args.figures or (None if args.quick else FIGURES)
    loads = (50, 150, 325, 400) if args.quick else LOADS
    curve_ws = (15, 35, 100) if args.quick else CURVE_WORKING_SETS
    starts = START_MINUTES[::3] if args.quick else START_MINUTES
    t0 = time.perf_counter()

    fig: dict[str, float] = {}
    rows = []
    for ws in WORKING_SETS:
        scenario = load_scenario(SCENARIO)
        scenario.trace.working_set = ws
        workload = build_workload(scenario.trace, scenario.models, scenario.seed)
        for note in workload.notes:
            print(f"ws{ws}: {note}", file=sys.stderr)
        per_minute = workload.counts.sum(axis=0)
        fig[f"ws{ws}_scale"] = round(workload.scale, 4)
        fig[f"ws{ws}_requests"] = int(per_minute.sum())
        fig[f"ws{ws}_peak_minute_requests"] = int(per_minute.max())
        res = {pol: run(ws, pol, seeds) for pol in POLICIES}
        base = res["lb"]
        for pol in POLICIES:
            r = res[pol]
            fig[f"{pol}_ws{ws}_avg_latency_s"] = round(r["avg_latency_s"], 4)
            fig[f"{pol}_ws{ws}_miss_ratio"] = round(r["miss_ratio"], 4)
            lat_red = reduction(base["avg_latency_s"], r["avg_latency_s"])
            miss_red = reduction(base["miss_ratio"], r["miss_ratio"])
            if pol != "lb":
                fig[f"{pol}_ws{ws}_latency_reduction_pct"] = round(lat_red, 2)
                fig[f"{pol}_ws{ws}_miss_reduction_pct"] = round(miss_red, 2)
            rows.append((ws, pol, r, lat_red, miss_red))

    print(
        f"GPU-FaaS reproduction: 12 GPUs x 8 GB, Table I models, 6 min at a mean of 325 req/min "
        f"(recorded shape; peak minute {', '.join(str(fig[f'ws{ws}_peak_minute_requests']) for ws in WORKING_SETS)} "
        f"at ws {'/'.join(map(str, WORKING_SETS))}), {len(seeds)} seeds"
    )
    print(
        f"{'ws':>3} {'policy':<8} {'avg lat s':>10} {'miss':>7} {'false':>7} {'dups':>6} {'SM':>6}"
        f" {'lat -% vs LB':>13} {'paper':>7} {'miss -% vs LB':>14} {'paper':>7}"
    )
    for ws, pol, r, lat_red, miss_red in rows:
        paper = PAPER.get((pol, ws), {})
        pl = f"{paper['latency']:.2f}" if paper.get("latency") is not None else "-"
        pm = f"{paper['miss']:.2f}" if paper.get("miss") is not None else "-"
        lr = f"{lat_red:.2f}" if pol != "lb" else "(base)"
        mr = f"{miss_red:.2f}" if pol != "lb" else "(base)"
        print(
            f"{ws:>3} {pol:<8} {r['avg_latency_s']:>10.2f} {r['miss_ratio']:>7.3f} {r['false_miss_ratio']:>7.3f}"
            f" {r['avg_top_model_duplicates']:>6.2f} {r['sm_utilization']:>6.3f} {lr:>13} {pl:>7} {mr:>14} {pm:>7}"
        )

    print("\nO3 limit sweep at working set 35 (the paper: limit 45 vs 0 cuts latency 85.1%, misses 45.83%)")
    print(f"{'limit':>5} {'avg lat s':>10} {'miss':>7}")
    sweep = {}
    for limit in range(0, 50, 5):
        r = run(35, "lalb_o3" if limit else "lalb", seeds, limit)
        sweep[limit] = r
        fig[f"o3_limit{limit}_ws35_avg_latency_s"] = round(r["avg_latency_s"], 4)
        fig[f"o3_limit{limit}_ws35_miss_ratio"] = round(r["miss_ratio"], 4)
        print(f"{limit:>5} {r['avg_latency_s']:>10.2f} {r['miss_ratio']:>7.3f}")
    fig["o3_limit45_vs_0_latency_reduction_pct"] = round(
        reduction(sweep[0]["avg_latency_s"], sweep[45]["avg_latency_s"]), 2
    )
    fig["o3_limit45_vs_0_miss_reduction_pct"] = round(reduction(sweep[0]["miss_ratio"], sweep[45]["miss_ratio"]), 2)

    by_load = load_curves(fig, seeds, loads, LOAD_CURVE_WS)
    by_ws = working_set_curves(fig, seeds, curve_ws)
    window_sensitivity(fig, seeds, starts)
    if figures is not None:
        files = plot(by_load, list(loads), by_ws, list(curve_ws), figures)
        print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)
    fig["seeds"] = len(seeds)
    fig["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
