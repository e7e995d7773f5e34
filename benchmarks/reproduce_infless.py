"""Reproduce INFless's evaluation (seeds/002, §5) in the simulator, with the published profiles.

1. Stress (Fig. 11): the largest constant load, the same RPS for every function of the app, that
   each system serves with no SLO violation on the paper's cluster (config/clusterCapConfig-dev.yml:
   4 nodes x 3 slots of 20 threads + one RTX 2080 Ti); RPS per unit of occupied resources
   (beta*threads + SM%, beta = 64/142 as the authors' code) and the maximum RPS, as ratios to
   OpenFaaS+ and BATCH measured in the same run; the ablations (no BB, no RS, OP1.5, OP2).
2. Traces (Fig. 12a, 15): the Sporadic / Periodic / Bursty 10-minute means, each point held 10 s
   (as the authors' load generator replays them), scaled so that every function's peak is half the
   smallest maximum load of the three systems in part 1 (all of them can serve the peak); RPS per
   unit of resource, SLO violations and cold starts (a request finding no warm capacity waits a
   cold start of `--cold-start` s; the paper gives no figure).
3. Batch sizes of ResNet-50 under the Periodic trace (Fig. 13).
4. Keep-alive (Fig. 16): LSTH (gamma 0.3 / 0.5 / 0.7) vs HHP over the four 7-day Azure traces at
   minute granularity (or any trace: `--keepalive-trace`, each of its functions a trace): cold
   starts per invocation, averaged both ways (the mean of the per-trace rates, and pooled over
   every invocation), per active minute, and loaded-idle minutes, the paper's figures beside. Against both HHP
   baselines (the last 4 hours, as INFless describes it; all history, as Shahrad et al. run it),
   as curves along gamma (0-1) and along the sample rule (the fewest idle times a histogram
   needs to be trusted, 0 = §3.5 as written): JSON keys `curve_gamma_*`, `curve_min_samples_*`,
   drawn to `docs/figures/infless_keepalive.png` (`--figures DIR` elsewhere; none with `--quick`
   unless asked), the paper's -21.9% / -24.3% starred.
5. Scheduling cost (Fig. 17): Algorithm 1 placing 10,000 instances of 40 functions on 2,000
   servers shaped as the config's nodes.

Prints the tables and, as its last line, one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.policies.infless import HybridHistogram, LongShortTermHistogram, Server  # noqa: E402
from faas_gpu.sim.curves import Mark, Panel, Series, plot_panels  # noqa: E402
from faas_gpu.sim.infless import (  # noqa: E402
    COLD_START_S,
    SCENARIOS,
    Function,
    KeepAliveStats,
    max_sustained,
    pattern_loads,
    replay_keepalive,
    scenario_functions,
    schedule_cost,
    simulate,
)
from faas_gpu.sim.infless.keepalive_replay import ASSUMED  # noqa: E402
from faas_gpu.sim.infless_data import (  # noqa: E402
    PATTERNS,
    data_dir,
    load_azure_minutes,
    load_cluster,
    load_keepalive_traces,
    load_pattern,
    load_profiles,
    slot_servers,
)
from faas_gpu.sim.scenario import ScenarioError  # noqa: E402

FIGURES = REPO / "docs" / "figures"
BASELINES = ("OpenFaaS+", "BATCH")
ABLATIONS = ("INFless-noBB", "INFless-noRS", "INFless-OP1.5", "INFless-OP2")
# the paper's figures
PAPER_STRESS = {"OpenFaaS+": 5.2, "BATCH": 2.6}  # Fig. 11, INFless x, "on average"
PAPER_TRACE = {  # Fig. 12a, INFless x vs (OpenFaaS+, BATCH)
    "Sporadic": (4.3, 2.6),
    "Periodic": (3.4, 1.8),
    "Bursty": (3.6, 2.2),
}
PAPER_ABLATION = {  # Fig. 11, throughput drop % (OSVT, Q&A); the paper gives OP as one figure
    "INFless-noBB": (45.6, 60.0),
    "INFless-OP1.5": (35.4, 34.3),
    "INFless-OP2": (35.4, 34.3),
    "INFless-noRS": (21.9, 7.0),
}
PAPER_TABLE4 = {"OpenFaaS+": (55.63, 2.13, 2e-5), "BATCH": (41.45, 1.34, 1.32e-5), "INFless": (13.91, 0.51, 1.6e-6)}
BETA_PRICE = 0.034 / (2.5 / 100)
GAMMAS = (0.3, 0.5, 0.7)
GAMMA_CURVE = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
MIN_SAMPLES_CURVE = (0, 1, 2, 3, 5, 10, 20, 40)  # LSTH's sample rule; 10 is HHP's, 0 is §3.5 as written
PAPER_LSTH_VS_HHP = (-21.9, -24.3)  # Fig. 16: cold starts, idle waste, LSTH vs HHP (%)
SLO_SWEEP_MS = (150, 250, 300, 350)
KEY = {"OSVT": "osvt", "Q&A": "qa", "OpenFaaS+": "openfaas", "BATCH": "batch"}


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf") if a > 0 else 0.0


def stress(fig: dict, servers: list[Server], profiles: dict, cold_s: float, quick: bool) -> dict[str, float]:
    print("== Stress (Fig. 11): max constant load with no SLO violation, same RPS per function ==")
    head = f"{'app':<5} {'system':<14} {'max RPS':>9} {'RPS/res':>9} {'threads':>7} {'SM %':>6}"
    print(
        head + f" {'INFless x (per res)':>20} {'INFless x (max RPS)':>20} {'CPUs/100RPS':>11} {'GPUs/100RPS':>11}"
        f" {'$/request':>10}"
    )
    peaks: dict[str, float] = {}
    for app in SCENARIOS:
        fns = scenario_functions(app, profiles)
        pts = {
            s: max_sustained(fns, servers, s, cold_start_s=cold_s, tolerance=0.05 if quick else 0.01)
            for s in ("INFless", *BASELINES, *ABLATIONS)
        }
        inf = pts["INFless"]
        for s, p in pts.items():
            r = p.result
            per_res = r.throughput_per_resource if p.rps_per_fn > 0 else 0.0  # a system that serves nothing
            x_res = ratio(inf.result.throughput_per_resource, per_res) if s != "INFless" else None
            x_rps = ratio(inf.total_rps, p.total_rps) if s != "INFless" else None
            fx = lambda v: f"{v:.2f}x" if v is not None and v != float("inf") else "-"  # noqa: E731
            if p.rps_per_fn <= 0:
                print(
                    f"{app:<5} {s:<14} cannot serve the app: no configuration of "
                    + ", ".join(f.name for f in fns if not r.fns[f.name].configs)
                    + " is predicted within the SLO"
                )
                fig[f"{KEY[app]}_{s.lower().replace('-', '_').replace('.', '')}_max_rps"] = 0.0
                continue
            cpus, sm = r.total("cpu_s") / r.seconds, r.total("gpu_s") / r.seconds
            print(
                f"{app:<5} {s:<14} {p.total_rps:>9.0f} {per_res:>9.3f} {cpus:>7.0f} {sm:>6.0f} {fx(x_res):>20}"
                f" {fx(x_rps):>20} {100 * cpus / p.total_rps:>11.2f} {sm / p.total_rps:>11.3f}"
                f" {r.cost_per_request():>10.2e}"
            )
            k = KEY[app]
            fig[f"{k}_{s.lower().replace('+', 'plus').replace('-', '_').replace('.', '')}_max_rps"] = round(
                p.total_rps, 1
            )
            if s in BASELINES:
                fig[f"{k}_infless_vs_{KEY[s]}_throughput_x"] = round(x_res, 2)
                fig[f"{k}_infless_vs_{KEY[s]}_max_rps_x"] = round(x_rps, 2)
        for s in ABLATIONS:
            abl_res = pts[s].result.throughput_per_resource if pts[s].rps_per_fn > 0 else 0.0
            drop_res = 100 * (1 - ratio(abl_res, inf.result.throughput_per_resource))
            drop_rps = 100 * (1 - ratio(pts[s].total_rps, inf.total_rps))
            tag = s.split("-")[1].replace(".", "")
            fig[f"{KEY[app]}_ablation_{tag}_drop_pct"] = round(drop_res, 1)
            fig[f"{KEY[app]}_ablation_{tag}_max_rps_drop_pct"] = round(drop_rps, 1)
        peaks[app] = min(pts[s].rps_per_fn for s in ("INFless", *BASELINES)) / 2
        configs = {f.name: sorted(inf.result.fns[f.name].configs) for f in fns}
        print(f"      INFless configurations (batch, threads, SM%): {configs}")
        for s in BASELINES:
            print(f"      {s} configurations: { {f.name: sorted(pts[s].result.fns[f.name].configs) for f in fns} }")
    for s in BASELINES:
        fig[f"infless_vs_{KEY[s]}_throughput_x"] = round(
            statistics.mean(fig[f"{KEY[a]}_infless_vs_{KEY[s]}_throughput_x"] for a in SCENARIOS), 2
        )
        fig[f"infless_vs_{KEY[s]}_max_rps_x"] = round(
            statistics.mean(fig[f"{KEY[a]}_infless_vs_{KEY[s]}_max_rps_x"] for a in SCENARIOS), 2
        )
        print(
            f"INFless vs {s}, mean of the two apps: {fig[f'infless_vs_{KEY[s]}_throughput_x']:.2f}x per unit of"
            f" resource, {fig[f'infless_vs_{KEY[s]}_max_rps_x']:.2f}x max RPS (paper: {PAPER_STRESS[s]}x)"
        )
    print(f"(Table 4, large-scale simulation: CPUs/GPUs per 100 RPS and $/request {PAPER_TABLE4})")
    print(
        f"\nbeta = {BETA_PRICE:.2f} (Table 4's prices: a thread at $0.034/h, 1% SM at $0.025/h) instead of 64/142,"
        " for Algorithm 1, BATCH's cost and the metric: INFless x (per unit of resource / max RPS)"
    )
    for app in SCENARIOS:
        fns = scenario_functions(app, profiles)
        pts = {
            s: max_sustained(fns, servers, s, cold_start_s=cold_s, tolerance=0.05 if quick else 0.01, beta=BETA_PRICE)
            for s in ("INFless", *BASELINES)
        }
        cells = []
        for s in BASELINES:
            x_res = ratio(pts["INFless"].result.throughput_per_resource, pts[s].result.throughput_per_resource)
            x_rps = ratio(pts["INFless"].total_rps, pts[s].total_rps)
            fig[f"{KEY[app]}_price_beta_infless_vs_{KEY[s]}_throughput_x"] = round(x_res, 2)
            cells.append(f"vs {s} {x_res:.2f}x / {x_rps:.2f}x")
        print(f"  {app:<5} " + "   ".join(cells))
    print("\nOSVT under other SLOs (Fig. 12b): INFless x BATCH, per unit of resource / max RPS (paper: 1.6x-3.5x)")
    fns_by_slo = {ms: scenario_functions("OSVT", profiles, ms / 1000) for ms in SLO_SWEEP_MS}
    cells = []
    for ms, fns in fns_by_slo.items():
        a, b = (
            max_sustained(fns, servers, s, cold_start_s=cold_s, tolerance=0.05 if quick else 0.01)
            for s in ("INFless", "BATCH")
        )
        x_res = ratio(a.result.throughput_per_resource, b.result.throughput_per_resource)
        x_rps = ratio(a.total_rps, b.total_rps)
        fig[f"osvt_slo{ms}_infless_vs_batch_throughput_x"] = round(x_res, 2)
        cells.append(f"{ms} ms: {x_res:.2f}x / {x_rps:.2f}x")
    print("  " + "   ".join(cells))
    print(f"\nAblations, throughput drop vs INFless (per unit of resource / max RPS); paper {PAPER_ABLATION}")
    for s in ABLATIONS:
        tag = s.split("-")[1].replace(".", "")
        cells = "  ".join(
            f"{a}: {fig[f'{KEY[a]}_ablation_{tag}_drop_pct']:+.1f}% /"
            f" {fig[f'{KEY[a]}_ablation_{tag}_max_rps_drop_pct']:+.1f}% (paper {PAPER_ABLATION[s][i]:.1f}%)"
            for i, a in enumerate(SCENARIOS)
        )
        print(f"  {s:<14} {cells}")
    return peaks


def traces(
    fig: dict, servers: list[Server], profiles: dict, peaks: dict, cold_s: float, points: int | None, directory: Path
) -> None:
    print(
        f"\n== Traces (Fig. 12a, 15): 10-min means held 10 s each ({points or 'all'} points), peak per function "
        + ", ".join(f"{a} {peaks[a]:.0f} RPS" for a in SCENARIOS)
        + " =="
    )
    print(
        f"{'app':<5} {'pattern':<9} {'system':<10} {'RPS/res':>9} {'SLO viol %':>10} {'cold %':>7} {'INFless x':>10}"
        f" {'paper x':>8}"
    )
    viol: dict[str, list[float]] = {s: [] for s in ("INFless", *BASELINES)}
    per_pattern: dict[tuple[str, str], list[float]] = {}
    resnet_batches: dict[str, dict[int, float]] = {}
    for app in SCENARIOS:
        fns = scenario_functions(app, profiles)
        for pat in PATTERNS:
            series = pattern_loads(load_pattern(pat, directory), peaks[app], points=points)
            loads = {f.name: series for f in fns}
            res = {s: simulate(fns, loads, servers, s, cold_start_s=cold_s) for s in ("INFless", *BASELINES)}
            for s, r in res.items():
                viol[s].append(100 * r.slo_violation)
                x = ratio(res["INFless"].throughput_per_resource, r.throughput_per_resource)
                paper = PAPER_TRACE[pat][BASELINES.index(s)] if s in BASELINES else None
                if s in BASELINES:
                    per_pattern.setdefault((pat, s), []).append(x)
                    fig[f"{KEY[app]}_{pat.lower()}_infless_vs_{KEY[s]}_x"] = round(x, 2)
                fig[f"{KEY[app]}_{pat.lower()}_{KEY.get(s, 'infless')}_slo_violation_pct"] = round(
                    100 * r.slo_violation, 2
                )
                print(
                    f"{app:<5} {pat:<9} {s:<10} {r.throughput_per_resource:>9.3f} {100 * r.slo_violation:>10.2f}"
                    f" {100 * r.cold_rate:>7.2f} {(f'{x:.2f}x' if s != 'INFless' else '-'):>10}"
                    f" {(f'{paper}x' if paper else '-'):>8}"
                )
                if app == "OSVT" and pat == "Periodic":
                    by = r.fns["resnet-50"].by_batch
                    total = sum(by.values()) or 1.0
                    resnet_batches[s] = {b: 100 * v / total for b, v in sorted(by.items()) if v > 0}
    for pat in PATTERNS:
        for s in BASELINES:
            fig[f"{pat.lower()}_infless_vs_{KEY[s]}_x"] = round(statistics.mean(per_pattern[(pat, s)]), 2)
        print(
            f"{pat}: INFless vs OpenFaaS+ {fig[f'{pat.lower()}_infless_vs_openfaas_x']:.2f}x (paper"
            f" {PAPER_TRACE[pat][0]}x), vs BATCH {fig[f'{pat.lower()}_infless_vs_batch_x']:.2f}x (paper"
            f" {PAPER_TRACE[pat][1]}x), mean of the two apps"
        )
    for s in ("INFless", *BASELINES):
        key = "infless" if s == "INFless" else KEY[s]
        fig[f"{key}_slo_violation_pct"] = round(statistics.mean(viol[s]), 2)
    print(
        "SLO violation, mean over apps and patterns: "
        + ", ".join(f"{s} {statistics.mean(v):.2f}%" for s, v in viol.items())
        + " (paper: INFless <= 3.1%, OpenFaaS+ up to 8% under Sporadic)"
    )
    print("\nResNet-50 under Periodic (Fig. 13): % of requests served per batch size")
    for s, by in resnet_batches.items():
        print(f"  {s:<10} " + "  ".join(f"b={b}: {p:.1f}%" for b, p in by.items()))
    fig["resnet50_infless_batch_sizes"] = sorted(resnet_batches["INFless"])
    fig["resnet50_batch_batch_sizes"] = sorted(resnet_batches["BATCH"])


def keepalive_traces(directory: Path, days: int | None, paths: list[Path], top: int) -> tuple[dict, str]:
    """The traces Fig. 16 is replayed on: INFless's Azure traces 1-4 (`days` of them), or the
    functions of the trace files given (`--keepalive-trace`); and how to name them."""
    if not paths:
        traces = {}
        for i in (1, 2, 3, 4):
            counts = load_azure_minutes(i, directory)
            traces[str(i)] = counts[: days * 1440] if days else counts
        return traces, f"Azure traces 1-4, {days or 7} days"
    traces, notes = load_keepalive_traces(paths, top)
    for note in notes:
        print(note)
    if days:
        traces = {k: v[: days * 1440] for k, v in traces.items()}
    return traces, f"{len(traces)} function(s) of {', '.join(p.name for p in paths)}"


def keepalive(fig: dict, traces: dict[str, list[float]], label: str, figures: Path | None) -> None:
    print(f"\n== Keep-alive (Fig. 16): {label} at minute granularity ==")
    print(f"({ASSUMED})")
    # HHP as INFless describes its baseline (idle times of the last 4 h), and as Shahrad et al.
    # run it (every idle time so far, histogram range 4 h); LSTH with its sample rule, and as
    # §3.5 reads to the letter (min_samples=0)
    policies = {"HHP": HybridHistogram(window_min=240), "HHP all history": HybridHistogram()}
    for g in GAMMAS:
        policies[f"LSTH g={g}"] = LongShortTermHistogram(gamma=g)
    policies["LSTH g=0.5, no sample rule"] = LongShortTermHistogram(min_samples=0)
    print(f"{'trace':>8} " + " ".join(f"{p:>28}" for p in policies) + "   (cold % of invocations / idle loaded min)")
    stats: dict[str, list[KeepAliveStats]] = {p: [] for p in policies}
    for name, counts in traces.items():
        cells = []
        for p, pol in policies.items():
            st = replay_keepalive(counts, pol)
            stats[p].append(st)
            cells.append(f"{100 * st.cold_rate:>6.2f}% / {st.wasted_minutes:>8.0f} ({st.cold_starts:>3} cold)")
        print(f"{name[:8]:>8} " + " ".join(f"{c:>28}" for c in cells))
    rates = {p: [100 * st.cold_rate for st in v] for p, v in stats.items()}
    waste = {p: [st.wasted_minutes for st in v] for p, v in stats.items()}
    avg = {p: averages(v) for p, v in stats.items()}
    hhp, hhp_waste = avg["HHP"], sum(waste["HHP"])
    hhp_cold = hhp.cold_mean
    print(
        "\nLSTH and HHP (all history) against HHP (4 h), both averaging ways: the mean of the per-trace rates, and "
        "pooled over invocations (all cold starts / all invocations); idle waste summed (paper: "
        f"{PAPER_LSTH_VS_HHP[0]:+.1f}% cold starts, {PAPER_LSTH_VS_HHP[1]:+.1f}% idle waste, 'on average')"
    )
    print(
        f"  {'policy':<28} {'cold % (mean)':>13} {'vs HHP':>8} {'cold % (pooled)':>15} {'vs HHP':>8}"
        f" {'idle min':>9} {'vs HHP':>8} {'cold / active min (mean, pooled)':>33}"
    )
    for name, a in avg.items():
        w = sum(waste[name])
        mean_x = change(a.cold_mean, hhp.cold_mean)
        pooled_x = change(a.cold_pooled, hhp.cold_pooled)
        waste_x = change(w, hhp_waste)
        print(
            f"  {name:<28} {a.cold_mean:>12.3f}% {fmt_change(mean_x, name == 'HHP'):>8} {a.cold_pooled:>14.3f}%"
            f" {fmt_change(pooled_x, name == 'HHP'):>8} {w:>9.0f} {fmt_change(waste_x, name == 'HHP'):>8}"
            f" {a.active_mean:>16.2f}% / {a.active_pooled:>6.2f}%"
        )
        if name == "HHP":
            continue
        if name == "HHP all history":
            fig["hhp_all_history_cold_start_pct"] = round(a.cold_mean, 3)
            fig["hhp_all_history_cold_start_pooled_pct"] = round(a.cold_pooled, 3)
            fig["hhp_all_history_vs_hhp_waste_change_pct"] = round(waste_x, 1)
            continue
        tag = "literal" if "no sample rule" in name else name.split("=")[1].replace(".", "")
        fig[f"lsth_g{tag}_cold_start_pct"] = round(a.cold_mean, 3)
        fig[f"lsth_g{tag}_cold_start_pooled_pct"] = round(a.cold_pooled, 3)
        fig[f"lsth_g{tag}_vs_hhp_cold_change_pct"] = round(mean_x, 1)
        fig[f"lsth_g{tag}_vs_hhp_cold_change_pooled_pct"] = round(pooled_x, 1)
        fig[f"lsth_g{tag}_vs_hhp_waste_change_pct"] = round(waste_x, 1)
        fig[f"lsth_g{tag}_cold_per_active_minute_pct"] = round(a.active_mean, 3)
        fig[f"lsth_g{tag}_cold_per_active_minute_pooled_pct"] = round(a.active_pooled, 3)
    fig["lsth_cold_start_pct"] = fig["lsth_g05_cold_start_pct"]
    fig["hhp_cold_start_pct"] = round(hhp.cold_mean, 3)
    fig["hhp_cold_start_pooled_pct"] = round(hhp.cold_pooled, 3)
    fig["hhp_cold_per_active_minute_pct"] = round(hhp.active_mean, 3)
    fig["hhp_cold_per_active_minute_pooled_pct"] = round(hhp.active_pooled, 3)
    fig["paper_lsth_vs_hhp_cold_change_pct"] = PAPER_LSTH_VS_HHP[0]
    fig["paper_lsth_vs_hhp_waste_change_pct"] = PAPER_LSTH_VS_HHP[1]
    fig["keepalive_traces"] = len(traces)
    all_cold = avg["HHP all history"].cold_mean
    all_waste = sum(waste["HHP all history"])
    lsth_cold, lsth_waste = avg["LSTH g=0.5"].cold_mean, sum(waste["LSTH g=0.5"])
    print(
        f"  LSTH g=0.5 vs HHP over all history: cold starts {change(lsth_cold, all_cold):+.1f}% (mean) / "
        f"{change(avg['LSTH g=0.5'].cold_pooled, avg['HHP all history'].cold_pooled):+.1f}% (pooled), "
        f"idle waste {change(lsth_waste, all_waste):+.1f}%"
    )
    fig["lsth_vs_hhp_all_history_cold_change_pct"] = round(change(lsth_cold, all_cold), 1)
    fig["lsth_vs_hhp_all_history_waste_change_pct"] = round(change(lsth_waste, all_waste), 1)
    fig["hhp_waste_min"] = round(hhp_waste)
    fig["hhp_all_history_waste_min"] = round(all_waste)

    def lsth(**kw) -> tuple[float, float]:
        """Mean cold-start % over the traces and their idle loaded minutes summed."""
        sts = [replay_keepalive(c, LongShortTermHistogram(**kw)) for c in traces.values()]
        return statistics.mean(100 * st.cold_rate for st in sts), sum(st.wasted_minutes for st in sts)

    known = {(g, 10): (statistics.mean(rates[f"LSTH g={g}"]), sum(waste[f"LSTH g={g}"])) for g in GAMMAS}
    known[(0.5, 0)] = statistics.mean(rates["LSTH g=0.5, no sample rule"]), sum(waste["LSTH g=0.5, no sample rule"])
    base = {"hhp": (hhp_cold, hhp_waste), "hhp_all_history": (all_cold, all_waste)}
    curves = {}
    for axis, points in (
        ("gamma", [(g, 10) for g in GAMMA_CURVE]),
        ("min_samples", [(0.5, m) for m in MIN_SAMPLES_CURVE]),
    ):
        xs = [g if axis == "gamma" else m for g, m in points]
        ys = [known.get((g, m)) or lsth(gamma=g, min_samples=m) for g, m in points]
        fig[f"curve_{axis}"] = xs
        fig[f"curve_{axis}_lsth_cold_start_pct"] = [round(c, 3) for c, _ in ys]
        fig[f"curve_{axis}_lsth_waste_min"] = [round(w) for _, w in ys]
        for name, (bc, bw) in base.items():
            fig[f"curve_{axis}_lsth_vs_{name}_cold_change_pct"] = [round(change(c, bc), 1) for c, _ in ys]
            fig[f"curve_{axis}_lsth_vs_{name}_waste_change_pct"] = [round(change(w, bw), 1) for _, w in ys]
        axis_label = (
            "gamma (weight of the 24 h histogram)" if axis == "gamma" else "min idle times to trust a histogram"
        )
        print(
            f"\n  LSTH along {axis_label} (gamma 0.5 / sample rule 10 elsewhere): cold % / idle min, change vs HHP"
            " (4 h) and vs HHP all history"
        )
        for x, (c, w) in zip(xs, ys, strict=True):
            print(
                f"  {x:>5} {c:>6.2f}% / {w:>7.0f}   vs 4 h {change(c, hhp_cold):+6.1f}% / "
                f"{change(w, hhp_waste):+6.1f}%   vs all history {change(c, all_cold):+6.1f}% / "
                f"{change(w, all_waste):+6.1f}%"
            )
        curves[axis] = (xs, ys, axis_label)
    if figures is not None:
        path = plot_keepalive(curves, base, figures / "infless_keepalive.png", label)
        print(f"wrote {path}", file=sys.stderr)


@dataclass(frozen=True)
class Averages:
    """A policy's cold starts over several traces, both ways (%): the mean of the per-trace rates
    (each trace weighs alike) and pooled (every invocation weighs alike: busy traces decide)."""

    cold_mean: float
    cold_pooled: float
    active_mean: float  # per active minute: a burst counts once
    active_pooled: float


def averages(stats: list[KeepAliveStats]) -> Averages:
    cold = sum(st.cold_starts for st in stats)
    invocations = sum(st.invocations for st in stats)
    active = sum(st.active_minutes for st in stats)
    return Averages(
        statistics.mean(100 * st.cold_rate for st in stats),
        100 * cold / invocations if invocations else 0.0,
        statistics.mean(100 * st.cold_rate_active for st in stats),
        100 * cold / active if active else 0.0,
    )


def change(value: float, base: float) -> float:
    """value against base, in %; 0 where both are 0 (no cold start either way)."""
    if base > 0:
        return 100 * (value / base - 1)
    return 0.0 if value == 0 else float("inf")


def fmt_change(x: float, base: bool) -> str:
    return "-" if base else f"{x:+.1f}%"


def plot_keepalive(
    curves: dict[str, tuple[list[float], list[tuple[float, float]], str]],
    base: dict[str, tuple[float, float]],
    path: Path,
    label: str,
) -> Path:
    """Cold starts, idle waste and the change against both HHPs, along gamma and the sample rule."""
    names = {"hhp": "HHP (last 4 h)", "hhp_all_history": "HHP (all history)"}
    panels = []
    for axis, (xs, ys, label) in curves.items():
        cold, idle = [c for c, _ in ys], [w for _, w in ys]
        at = 0.5 if axis == "gamma" else 10
        panels += [
            Panel(
                f"cold starts along {axis}",
                label,
                "% of invocations (mean of the traces)",
                [Series("LSTH", xs, cold, "tab:green")],
                hlines=[(b[0], names[k]) for k, b in base.items()],
                vline=at,
                vline_label="default",
            ),
            Panel(
                f"idle loaded minutes along {axis}",
                label,
                "minutes (the traces summed)",
                [Series("LSTH", xs, idle, "tab:green")],
                hlines=[(b[1], names[k]) for k, b in base.items()],
                vline=at,
                vline_label="default",
            ),
            Panel(
                f"LSTH vs HHP along {axis}",
                label,
                "change, %",
                [
                    Series(f"{what} vs {names[k]}", xs, [100 * (v[j] / base[k][j] - 1) for v in ys], color)
                    for k, shade in (("hhp", ("tab:blue", "tab:cyan")), ("hhp_all_history", ("tab:red", "tab:pink")))
                    for j, (what, color) in enumerate(zip(("cold", "waste"), shade, strict=True))
                ],
                marks=[Mark(0.5, PAPER_LSTH_VS_HHP[0], "cold"), Mark(0.5, PAPER_LSTH_VS_HHP[1], "waste")]
                if axis == "gamma"
                else [],
                hlines=[(0.0, "")],
                vline=at,
                vline_label="default",
            ),
        ]
    return plot_panels(
        path,
        panels,
        f"INFless keep-alive: LSTH against both HHP baselines, {label}",
        ncols=3,
    )


def sched_cost(fig: dict, profiles: dict, directory: Path, n_servers: int, n_instances: int) -> None:
    node = load_cluster(directory)[0]
    servers = [Server(f"n{i}", float(node.threads), [100.0] * len(node.gpu_memory_mb)) for i in range(n_servers)]
    models = [m for app in SCENARIOS for m in SCENARIOS[app][0]]
    fns = []
    for k in range(40):  # 40 functions, SLOs spread over each app's range (Fig. 17: "varying their SLOs")
        m = models[k % len(models)]
        lo, hi = (0.05, 0.10) if m in SCENARIOS["Q&A"][0] else (0.15, 0.30)
        fns.append(Function(f"{m}#{k}", lo + (hi - lo) * (k // len(models)) / 7, tuple(profiles[m])))
    c = schedule_cost(fns, servers, n_instances)
    print(
        f"\n== Scheduling cost (Fig. 17): {c.instances} instances, 40 functions, {c.servers} servers "
        f"({node.threads} threads + {len(node.gpu_memory_mb)} GPUs each) =="
    )
    print(
        f"  {c.seconds:.2f} s in all, {c.calls} schedule() calls ({1000 * c.seconds / c.calls:.1f} ms per call),"
        f" {c.ms_per_instance:.3f} ms per instance (paper: 0.5 ms per instance, < 1 s overall)"
    )
    fig["schedule_ms_per_instance"] = round(c.ms_per_instance, 4)
    fig["schedule_total_s"] = round(c.seconds, 3)
    fig["schedule_ms_per_call"] = round(1000 * c.seconds / c.calls, 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter traces, 2 days of Azure, 2,000 instances")
    p.add_argument("--data", type=Path, default=None, help="INFless data folder (default $FAAS_GPU_INFLESS_DATA)")
    p.add_argument("--cold-start", type=float, default=COLD_START_S, help="cold start time, s (an assumption)")
    p.add_argument(
        "--keepalive-trace",
        type=Path,
        action="append",
        help="replay Fig. 16 on this trace instead of INFless's traces 1-4 (repeatable): a per-minute count file, an "
        "Azure Functions 2019 invocations CSV or a 2021 per-invocation CSV; each function in it is one trace",
    )
    p.add_argument(
        "--keepalive-top",
        type=int,
        default=100,
        help="with --keepalive-trace: the busiest functions replayed (default 100; an Azure day has ~46,000)",
    )
    p.add_argument(
        "--keepalive-only", action="store_true", help="only part 4, the keep-alive replay (with --keepalive-trace)"
    )
    p.add_argument(
        "--figures",
        type=Path,
        default=None,
        help=f"folder for the PNG curves (default {FIGURES}; none with --quick or --keepalive-trace)",
    )
    args = p.parse_args(argv)
    figures = args.figures or (None if args.quick or args.keepalive_trace else FIGURES)
    directory = data_dir(args.data)
    try:  # read first: a bad trace is refused before minutes of the other parts
        keepalive_series, label = keepalive_traces(
            directory, 2 if args.quick else None, args.keepalive_trace or [], args.keepalive_top
        )
    except ScenarioError as exc:
        print(f"reproduce_infless: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    fig: dict = {}
    if args.keepalive_only:
        keepalive(fig, keepalive_series, label, figures)
        fig["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(fig))
        return 0
    profiles = load_profiles(directory)
    servers = slot_servers(load_cluster(directory))
    print(
        f"INFless reproduction: {len(servers)} slots (socket + GPU) from {directory}/config, cold start"
        f" {args.cold_start:g} s, predictor = profile x 1.10"
    )
    peaks = stress(fig, servers, profiles, args.cold_start, args.quick)
    traces(fig, servers, profiles, peaks, args.cold_start, 240 if args.quick else None, directory)
    keepalive(fig, keepalive_series, label, figures)
    sched_cost(fig, profiles, directory, 2000, 2000 if args.quick else 10_000)
    fig["cold_start_s"] = args.cold_start
    fig["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
