"""Simulation outputs: a summary CSV, per-request latencies, and two PNG plots."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .engine import RunResult  # noqa: E402

BAR_METRICS = [
    ("avg_latency_s", "average latency (s)"),
    ("miss_ratio", "cache miss ratio"),
    ("false_miss_ratio", "false miss ratio"),
    ("avg_top_model_duplicates", "duplicates of the top model"),
    ("sm_utilization", "SM utilisation"),
]


def label(r: RunResult) -> str:
    return f"{r.policy}(limit {r.o3_limit})" if r.policy == "lalb_o3" else r.policy


def write_report(results: list[RunResult], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.csv"
    rows = [r.summary() for r in results]
    with summary.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    latencies = out_dir / "latencies.csv"
    with latencies.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["policy", "o3_limit", "working_set", "latency_s"])
        for r in results:
            for v in r.latencies:
                w.writerow([r.policy, r.o3_limit, r.working_set, f"{v:.6f}"])

    cdf = out_dir / "latency_cdf.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        xs = np.sort(r.latencies)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{label(r)} ws{r.working_set}")
    ax.set_xscale("log")
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(cdf, dpi=120)
    plt.close(fig)

    bars = out_dir / "policies.png"
    fig, axes = plt.subplots(1, len(BAR_METRICS), figsize=(3.2 * len(BAR_METRICS), 3.4))
    names = [f"{label(r)}\nws{r.working_set}" for r in results]
    for ax, (key, title) in zip(axes, BAR_METRICS, strict=True):
        ax.bar(range(len(rows)), [row[key] for row in rows], color="tab:blue")
        ax.set_xticks(range(len(rows)), names, fontsize=6, rotation=45, ha="right")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(bars, dpi=120)
    plt.close(fig)
    return [summary, latencies, cdf, bars]
