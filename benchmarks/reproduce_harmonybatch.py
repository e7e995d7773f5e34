"""Reproduce HarmonyBatch's results (seeds/003: Table I, Fig. 11-12, Table IV) with the pure planner.

1. Table I: VGG-19, three apps (SLO 0.5 / 0.8 / 1.0 s, 5 / 10 / 20 req/s), BATCH vs MBS+ vs
   HarmonyBatch, normalised to BATCH, plans beside the reference run's (shared data,
   `table1_repro.txt`) and the paper's. The paper's figures come from the authors' code, whose
   equivalent timeout is not Eq. 5 as printed (see faas_gpu/policies/harmony/cost.py), so the
   table is computed with that formula (`Options.reference()`), then again with Eq. 5.
2. The four models (BERT, GPT-2, VGG-19, VideoMAE), 8 apps each, replayed in the simulator: cost
   per request as a ratio to BATCH in the same run, and SLO violation rates. App k (1..8) replays
   the shared trace app((k-1) mod 4 + 1).csv at half its rate (the 4 traces' total load spread
   over 8 SLO classes); apps 5-8 start 60 minutes into their trace, so no two apps move together.
   SLOs rise with k: 0.2..0.9 s for VGG-19 and BERT, 1.0..2.4 s for GPT-2 and VideoMAE (the
   paper's ranges and steps, 8 apps). Every strategy re-plans each replayed minute with that
   minute's rates and sees the same Poisson arrivals.
   The same arrivals then go through the provider's live pools (`replay_live`: the
   `AppPools` the provider's HarmonyBatch scaling decides with; rates over 30 s, a re-plan every
   10 s kept only when it differs enough). The same replay with the authors' equivalent timeout
   follows, then what Alg. 1's merges do
   (Fig. 13) and the knee rates (Fig. 7).
3. Planner run time for 1, 6 and 12 VGG-19 apps (Table IV), cold (nothing cached) and warm.

Prints the tables and, as its last line, one JSON object with the figures.
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

from faas_gpu.paths import SHARED_DATA  # noqa: E402
from faas_gpu.policies.harmony import (  # noqa: E402
    ALIBABA_FC_CNY,
    App,
    Options,
    harmony,
    plan,
    provisioner,
)
from faas_gpu.policies.harmony import planner as planner_mod  # noqa: E402
from faas_gpu.policy_data.harmony import load_models, load_platform  # noqa: E402
from faas_gpu.sim.harmony import TraceApp, load_app_trace, replay, replay_live  # noqa: E402

DATA = SHARED_DATA / "harmonybatch"
STRATEGIES = ("batch", "mbs", "harmony")
NAMES = {"batch": "BATCH", "mbs": "MBS+", "harmony": "HarmonyBatch"}
TABLE1_APPS = [App("app0", 0.5, 5.0), App("app1", 0.8, 10.0), App("app2", 1.0, 20.0)]
# table1_repro.txt (the authors' code, run offline) and Table I of the paper
TABLE1_REF = {
    "batch": (1.000, "(1.55,1,[0])c ; (1.50,2,[0.285])c ; (1.50,2,[0.485])c"),
    "mbs": (0.882, "(1.50,1,[0,0,0])c app0+app1+2.5 of app2 ; (2,11,[0.658])g 17.5 of app2"),
    "harmony": (0.635, "(1.60,1,[0])c app0 ; (2,13,[0.454,0.654])g app1+app2"),
}
TABLE1_PAPER = {"batch": 1.00, "mbs": 0.88, "harmony": 0.63}
MODELS = {  # model -> SLOs of apps 1..8
    "Bert": [round(0.2 + 0.1 * i, 2) for i in range(8)],
    "GPT-2": [round(1.0 + 0.2 * i, 2) for i in range(8)],
    "VGG19": [round(0.2 + 0.1 * i, 2) for i in range(8)],
    "VideoMAE": [round(1.0 + 0.2 * i, 2) for i in range(8)],
}
# §V-C: HarmonyBatch's cost reduction vs MBS+ "16.1%, 59.6%, 54.5% and 52.9% for the four workloads"
# (taken in Table III's order: VideoMAE, VGG-19, BERT, GPT-2); Table IV: run time in ms
PAPER_VS_MBS = {"VideoMAE": 16.1, "VGG19": 59.6, "Bert": 54.5, "GPT-2": 52.9}
PAPER_RUNTIME = {1: (34, 176, 2), 6: (222, 3497, 23), 12: (393, 8156, 38)}


def describe(p) -> str:
    """Groups in the paper's notation, with the apps (or the share of an app) each one serves."""
    full = {a.name: a.rate for a in TABLE1_APPS}
    parts = []
    for g in p.groups:
        who = "+".join(a.name if a.rate == full.get(a.name) else f"{a.rate:g} of {a.name}" for a in g.apps)
        parts.append(f"{g.label()} {who}")
    return " ; ".join(parts)


def table1(fig: dict, options: Options, key: str, title: str, models, platform) -> None:
    vgg = models["VGG19"]
    plans = {s: plan(TABLE1_APPS, vgg, ALIBABA_FC_CNY, s, platform, options) for s in STRATEGIES}
    base = plans["batch"].cost_per_request
    print(f"\n{title}")
    print(f"{'strategy':<13} {'cost/req':>11} {'norm':>6} {'ref':>6} {'paper':>6}  plan")
    for s in STRATEGIES:
        p = plans[s]
        norm = p.cost_per_request / base
        fig[f"{key}_{s}"] = round(norm, 4)
        ref, ref_plan = TABLE1_REF[s]
        paper = TABLE1_PAPER[s]
        print(f"{NAMES[s]:<13} {p.cost_per_request:>11.4e} {norm:>6.3f} {ref:>6.3f} {paper:>6.2f}  {describe(p)}")
        if key == "table1":
            print(f"{'':<13} {'':>11} {'':>6} {'':>6} {'':>6}  reference: {ref_plan}")


def trace_apps(slos: list[float]) -> list[TraceApp]:
    traces = [load_app_trace(DATA / "app_traces" / f"app{i}.csv", scale=0.5) for i in range(1, 5)]
    apps = []
    for k in range(8):
        t = traces[k % 4]
        shift = 60 * (k // 4)
        apps.append(TraceApp(f"app{k + 1}", slos[k], t[shift:] + t[:shift]))
    return apps


def simulate(name: str, options: Options, models, platform, minutes: list[int], window_s: float, seed: int):
    """Replay the 8 apps of `name` under every strategy; returns {strategy: (SimResult, mean GPU share)}."""
    m = models[name]
    apps = trace_apps(MODELS[name])
    out = {}
    for s in STRATEGIES:
        shares: list[float] = []

        def planner(current, s=s, shares=shares):
            p = plan(current, m, ALIBABA_FC_CNY, s, platform, options)
            shares.append(sum(g.rate for g in p.groups if g.kind == "gpu") / p.rate)
            return p

        out[s] = (replay(apps, planner, m, ALIBABA_FC_CNY, minutes, window_s, seed), statistics.mean(shares))
    return out


def models_section(fig: dict, models, platform, minutes: list[int], window_s: float, seed: int) -> None:
    print(f"\nFour models x 8 apps, simulated: {len(minutes)} minutes of the traces, {window_s:g} s each, seed {seed}")
    print(
        f"{'model':<9} {'strategy':<13} {'requests':>9} {'cost/BATCH':>10} {'predicted':>9} "
        f"{'SLO viol.':>9} {'mean batch':>10} {'GPU share':>9}"
    )
    for name in MODELS:
        res = simulate(name, Options(), models, platform, minutes, window_s, seed)
        base = res["batch"][0].cost_per_request
        for s in STRATEGIES:
            r, gpu = res[s]
            ratio = r.cost_per_request / base
            fig[f"{name}_{s}_cost_ratio"] = round(ratio, 4)
            fig[f"{name}_{s}_slo_violation"] = round(r.violation_rate, 5)
            print(
                f"{name:<9} {NAMES[s]:<13} {r.requests:>9} {ratio:>10.3f} {r.predicted_cost / r.requests / base:>9.3f} "
                f"{r.violation_rate:>9.4f} {r.mean_batch:>10.2f} {gpu:>9.2f}"
            )
        cut = 100 * (1 - res["harmony"][0].cost_per_request / res["mbs"][0].cost_per_request)
        fig[f"{name}_harmony_vs_mbs_cut_pct"] = round(cut, 2)
        print(f"{'':<9} HarmonyBatch vs MBS+: {-cut:+.1f}% cost (paper: -{PAPER_VS_MBS[name]:.1f}%)")

    print("\nThe same with the authors' equivalent timeout (Options.reference()): cost / BATCH, SLO violations")
    print(f"{'model':<9} {'MBS+':>7} {'Harmony':>8} {'Harmony vs MBS+':>16} {'viol. MBS+':>10} {'viol. Harmony':>13}")
    for name in MODELS:
        res = simulate(name, Options.reference(), models, platform, minutes, window_s, seed)
        base = res["batch"][0].cost_per_request
        mbs, har = res["mbs"][0], res["harmony"][0]
        cut = 100 * (har.cost_per_request / mbs.cost_per_request - 1)
        fig[f"{name}_ref_harmony_vs_mbs_cut_pct"] = round(-cut, 2)
        print(
            f"{name:<9} {mbs.cost_per_request / base:>7.3f} {har.cost_per_request / base:>8.3f} {cut:>+15.1f}% "
            f"{mbs.violation_rate:>10.4f} {har.violation_rate:>13.4f}"
        )


def live_section(fig: dict, models, platform, minutes: list[int], window_s: float, seed: int) -> None:
    """The same arrivals through the provider's live pools (`replay_live`: the rate window, a
    re-plan every 10 s applied only when it differs enough), against the per-minute oracle above."""
    print(
        "\nThe same replay through the provider's live pools (rates over 30 s, re-plan every 10 s when the"
        " plan differs): cost / BATCH (live), SLO violations, plans applied; the per-minute oracle's beside"
    )
    print(f"{'model':<9} {'strategy':<13} {'cost/BATCH':>10} {'oracle':>7} {'SLO viol.':>9} {'oracle':>7} {'plans':>6}")
    for name in MODELS:
        m = models[name]
        apps = trace_apps(MODELS[name])
        live, oracle = {}, {}
        for s in STRATEGIES:

            def planner(current, s=s, m=m):
                return plan(current, m, ALIBABA_FC_CNY, s, platform, Options())

            live[s] = replay_live(apps, planner, m, ALIBABA_FC_CNY, minutes, window_s, seed)
            oracle[s] = replay(apps, planner, m, ALIBABA_FC_CNY, minutes, window_s, seed)
        base, obase = live["batch"][0].cost_per_request, oracle["batch"].cost_per_request
        for s in STRATEGIES:
            (r, n), o = live[s], oracle[s]
            fig[f"{name}_{s}_live_cost_ratio"] = round(r.cost_per_request / base, 4)
            fig[f"{name}_{s}_live_slo_violation"] = round(r.violation_rate, 5)
            fig[f"{name}_{s}_live_plans"] = n
            print(
                f"{name:<9} {NAMES[s]:<13} {r.cost_per_request / base:>10.3f} {o.cost_per_request / obase:>7.3f} "
                f"{r.violation_rate:>9.4f} {o.violation_rate:>7.4f} {n:>6}"
            )
        cut = 100 * (1 - live["harmony"][0].cost_per_request / live["mbs"][0].cost_per_request)
        fig[f"{name}_live_harmony_vs_mbs_cut_pct"] = round(cut, 2)
        print(f"{'':<9} HarmonyBatch vs MBS+ (live pools): {-cut:+.1f}% cost")


def merging_section(fig: dict, models, platform) -> None:
    """Fig. 13-14: what Alg. 1's merges do, on minute 0 of each model's 8 apps; and Fig. 7's knee rates."""
    print("\nTwo-stage merging on minute 0 (Fig. 13): groups before -> after, cost after / before")
    for name in MODELS:
        apps = [App(a.name, a.slo, a.rates[0]) for a in trace_apps(MODELS[name])]
        prov = provisioner(models[name], ALIBABA_FC_CNY, platform)
        groups, trace = harmony(apps, prov)
        kinds = "".join(g.kind[0] for g in groups)
        fig[f"{name}_merge_cost_ratio"] = round(trace[-1] / trace[0], 4)
        gpu = sum(g.rate for g in groups if g.kind == "gpu") / sum(g.rate for g in groups)
        print(
            f"  {name:<9} {len(apps)} -> {len(groups)} groups ({kinds}), {len(trace) - 1} merges, "
            f"cost x{trace[-1] / trace[0]:.3f}, {100 * gpu:.0f}% of requests on GPU"
        )
    prov = provisioner(models["VGG19"], ALIBABA_FC_CNY, platform)
    knees = {s: prov.knee_rate(s) for s in (0.3, 0.5, 0.8, 1.0, 1.5, 2.0)}
    print(
        "Knee rate r* for one VGG-19 app (Fig. 7), req/s by SLO: "
        + ", ".join(f"{s:g} s: {r:.1f}" for s, r in knees.items())
    )
    fig["VGG19_knee_rps_slo1"] = round(knees[1.0], 3)


def runtime_apps(n: int) -> list[App]:
    """n VGG-19 apps: SLOs spread over 0.2..1.0 s, rates from minute 0 of the traces (half rate)."""
    traces = [load_app_trace(DATA / "app_traces" / f"app{i}.csv", scale=0.5) for i in range(1, 5)]
    slos = [0.6] if n == 1 else [round(0.2 + 0.8 * i / (n - 1), 3) for i in range(n)]
    return [App(f"app{i + 1}", slos[i], traces[i % 4][i]) for i in range(n)]


def runtime_section(fig: dict, models, platform, repeats: int) -> None:
    vgg = models["VGG19"]
    print(f"\nPlanner run time, VGG-19 (ms, median of {repeats}; cold = no cached provisioner)")
    print(f"{'apps':>4} {'BATCH':>8} {'MBS+':>8} {'Harmony':>8} {'Harmony warm':>12}   paper: BATCH / MBS+ / Harmony")
    for n in (1, 6, 12):
        apps = runtime_apps(n)
        row = {}
        for s in STRATEGIES:
            cold, warm = [], []
            for _ in range(repeats):
                planner_mod.provisioner.cache_clear()
                t0 = time.perf_counter()
                plan(apps, vgg, ALIBABA_FC_CNY, s, platform)
                t1 = time.perf_counter()
                plan(apps, vgg, ALIBABA_FC_CNY, s, platform)
                t2 = time.perf_counter()
                cold.append((t1 - t0) * 1000)
                warm.append((t2 - t1) * 1000)
            row[s] = (statistics.median(cold), statistics.median(warm))
            fig[f"runtime_ms_{n}apps_{s}"] = round(row[s][0], 3)
        fig[f"runtime_ms_{n}apps"] = round(row["harmony"][0], 3)
        fig[f"runtime_ms_{n}apps_warm"] = round(row["harmony"][1], 3)
        pb, pm, ph = PAPER_RUNTIME[n]
        print(
            f"{n:>4} {row['batch'][0]:>8.2f} {row['mbs'][0]:>8.2f} {row['harmony'][0]:>8.2f} {row['harmony'][1]:>12.2f}"
            f"   {pb} / {pm} / {ph}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minute-step", type=int, default=4, help="replay every n-th minute of the 120 (default 4)")
    p.add_argument("--window-s", type=float, default=30.0, help="seconds simulated per replayed minute")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15, help="runs per run-time measurement")
    args = p.parse_args(argv)

    models = load_models(DATA / "model.json")
    platform = load_platform(DATA / "config.json")
    fig: dict[str, float] = {}
    print("HarmonyBatch reproduction (prices: the authors' code's, Alibaba FC in CNY; costs are ratios)")
    table1(
        fig,
        Options.reference(),
        "table1",
        "Table I (equivalent timeout as the authors' code computes it)",
        models,
        platform,
    )
    table1(fig, Options(), "table1_eq5", "Table I with Eq. 5 as printed (this planner's default)", models, platform)
    models_section(fig, models, platform, list(range(0, 120, args.minute_step)), args.window_s, args.seed)
    live_section(fig, models, platform, list(range(0, 120, args.minute_step)), args.window_s, args.seed)
    merging_section(fig, models, platform)
    runtime_section(fig, models, platform, args.repeats)
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
