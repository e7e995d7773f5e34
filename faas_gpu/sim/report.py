"""Simulation outputs: a summary CSV, per-request latencies, PNG plots and a one-page HTML report.

`report.html` is what `faas-gpu sim --trace` points a user at when trying a policy on their own
trace before deploying it: per-policy figures, the latency CDF per policy, misses per minute
beside the requests per minute, and the GPU memory the loaded models hold over time.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .engine import RunResult  # noqa: E402
from .trace import Workload  # noqa: E402

MAX_BINS = 1440
"""The most bars or steps a timeline draws along its run: a longer run is drawn per N minutes
(a million-minute run drawn per minute took a quarter of an hour and gigabytes, issue 45)."""

BAR_METRICS = [
    ("avg_latency_s", "average latency (s)"),
    ("miss_ratio", "cache miss ratio"),
    ("false_miss_ratio", "false miss ratio"),
    ("avg_top_model_duplicates", "duplicates of the top model"),
    ("sm_utilization", "SM utilisation"),
]


def label(r: RunResult) -> str:
    return f"{r.policy}(limit {r.o3_limit})" if r.policy == "lalb_o3" else r.policy


def write_report(
    results: list[RunResult],
    out_dir: Path,
    workload: Workload | None = None,
    title: str = "",
    notes: list[str] | None = None,
) -> list[Path]:
    """summary.csv, latencies.csv, latency_cdf.png, policies.png, timeline.png, report.html and, with the
    workload, requests_per_minute.csv (the trace's counts beside the requests sent)."""
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
    timeline = write_timeline(results, out_dir / "timeline.png", workload)
    files = [summary, latencies, cdf, bars, timeline]
    if workload is not None:
        files.append(write_requests(workload, out_dir / "requests_per_minute.csv"))
    files.append(write_html(results, out_dir / "report.html", title, notes or [], workload is not None))
    return files


def write_requests(workload: Workload, path: Path) -> Path:
    """Per function and minute: what the trace records and the requests the simulator sent.

    `requests` is counted from the arrivals themselves, not copied from the plan, so a user can
    check the replay against their own trace (`trace_minute` is the trace's minute, from 0).
    """
    sent = workload.arrival_counts()
    starts = workload.starts or [0] * len(workload.functions)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["function", "model", "minute", "trace_minute", "recorded", "requests"])
        for f, (name, model) in enumerate(zip(workload.functions, workload.models, strict=True)):
            for minute in range(sent.shape[1]):
                recorded = workload.recorded[f, minute]
                w.writerow([name, model.name, minute, starts[f] + minute, f"{recorded:g}", int(sent[f, minute])])
    return path


def bin_minutes(minutes: float) -> int:
    """Minutes per bin of a timeline `minutes` long: 1, or as many as keep it to `MAX_BINS` bins."""
    return max(1, int(np.ceil(minutes / MAX_BINS)))


def write_timeline(results: list[RunResult], path: Path, workload: Workload | None) -> Path:
    """Requests and misses per minute (per N minutes past `MAX_BINS` minutes), and the cluster's
    loaded model memory, along the run."""
    rows = 3 if workload is not None else 2
    fig, axes = plt.subplots(rows, 1, figsize=(7, 2.1 * rows + 0.4), sharex=True)
    end = max((r.makespan_s for r in results), default=60.0) / 60.0
    if workload is not None:
        end = max(end, workload.counts.shape[1])
    width = bin_minutes(end)
    per = "min" if width == 1 else f"{width} min"
    ax = iter(axes)
    if workload is not None:
        a = next(ax)
        per_minute = workload.counts.sum(axis=0)
        padded = np.pad(per_minute, (0, -len(per_minute) % width))
        per_bin = padded.reshape(-1, width).sum(axis=1)
        a.bar(np.arange(len(per_bin)) * width + width / 2, per_bin, width=width, color="tab:grey")
        a.set_ylabel(f"requests / {per}", fontsize=8)
        a.set_title("the trace as replayed", fontsize=9)
    a = next(ax)
    bins = np.arange(0, max(1, int(np.ceil(end / width))) + 1) * width
    for r in results:
        counts, _ = np.histogram(r.dispatch_times[~r.dispatch_hits] / 60.0, bins=bins)
        a.step(bins[:-1], counts, where="post", label=label(r))
    a.set_ylabel(f"misses / {per}", fontsize=8)
    a.set_title("cache misses (a model loaded before the job ran)", fontsize=9)
    a.legend(fontsize=7)
    a = next(ax)
    for r in results:
        steps = r.memory_steps + [(r.makespan_s, r.memory_steps[-1][1])] if r.memory_steps else []
        if steps and r.memory_capacity_mb:
            t, mb = (np.array(v) for v in zip(*steps, strict=True))
            t, mb = _thin(t / 60.0, mb, width)
            a.step(t, 100.0 * mb / r.memory_capacity_mb, where="post", label=label(r))
    a.set_ylabel("% of GPU memory", fontsize=8)
    a.set_title("GPU memory held by loaded models (all GPUs)", fontsize=9)
    a.set_xlabel("minute", fontsize=8)
    a.legend(fontsize=7)
    for a in axes:
        a.tick_params(labelsize=7)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _thin(t: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A step series kept to `MAX_BINS` steps: past that, the largest value of each bin at its start."""
    if len(t) <= 2 * MAX_BINS:
        return t, values
    index = (t // width).astype(int)
    keys, first = np.unique(index, return_index=True)
    peaks = np.maximum.reduceat(values, first)
    return keys * float(width), peaks


HTML_COLUMNS = [
    ("requests", "requests", "{:d}"),
    ("avg_latency_s", "mean latency (s)", "{:.3f}"),
    ("p50_latency_s", "P50 (s)", "{:.3f}"),
    ("p99_latency_s", "P99 (s)", "{:.3f}"),
    ("miss_ratio", "miss ratio", "{:.3f}"),
    ("false_miss_ratio", "false-miss ratio", "{:.3f}"),
    ("sm_utilization", "SM utilisation", "{:.3f}"),
    ("makespan_s", "last job done (s)", "{:.0f}"),
]


def write_html(results: list[RunResult], path: Path, title: str, notes: list[str], counts: bool = False) -> Path:
    """One self-contained page over the PNGs beside it (no script, no external resource)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in HTML_COLUMNS)
    body = []
    for r in results:
        row = r.summary()
        cells = "".join(f"<td>{fmt.format(row[k])}</td>" for k, _, fmt in HTML_COLUMNS)
        peak = f"<td>{100 * r.peak_memory_ratio:.0f}%</td>"
        body.append(f"<tr><th>{html.escape(label(r))}</th>{cells}{peak}</tr>")
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    per_minute = (
        '; requests per function and minute, recorded and sent: <a href="requests_per_minute.csv">'
        "requests_per_minute.csv</a>"
        if counts
        else ""
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>faas-gpu sim: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:1em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:right}}img{{max-width:100%}}</style></head>
<body><h1>faas-gpu sim: {html.escape(title)}</h1>
<ul>{items}</ul>
<table><tr><th>policy</th>{head}<th>peak GPU memory (one GPU)</th></tr>
{"".join(body)}</table>
<h2>Latency CDF per policy</h2><img src="latency_cdf.png" alt="latency CDF per policy">
<h2>Requests, misses and GPU memory over time</h2><img src="timeline.png" alt="timeline">
<h2>Policies side by side</h2><img src="policies.png" alt="policy figures">
<p>Per-request latencies: <a href="latencies.csv">latencies.csv</a>;
figures: <a href="summary.csv">summary.csv</a>{per_minute}.</p>
</body></html>
"""
    path.write_text(page)
    return path
