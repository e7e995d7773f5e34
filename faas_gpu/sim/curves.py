"""Curves for the reproductions: a figure along a swept axis, the paper's points marked.

A single operating point hides where a claim holds (LALB's −98% against LB is the paper's load,
where LB's queue grows all run; at a third of it the cut is about half). The reproduction scripts
(`benchmarks/reproduce_*.py`) sweep load or working set and draw each figure as a curve per
policy with this module, the paper's own figures as black stars and its operating point as a
dotted line, so a reader sees at once where the reproduction meets the paper and where it parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    color: str | None = None  # the same policy in the same colour on every panel


@dataclass
class Mark:
    """A figure the paper reports, drawn as a star at (x, y), `label` written beside it."""

    x: float
    y: float
    label: str = "paper"


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    marks: list[Mark] = field(default_factory=list)
    vline: float | None = None  # the paper's operating point on the x axis
    vline_label: str = "paper's set-up"
    log_y: bool = False
    hlines: list[tuple[float, str]] = field(default_factory=list)  # baselines drawn across (value, label)


def plot_panels(path: Path, panels: list[Panel], title: str, ncols: int | None = None) -> Path:
    """Write the panels as one PNG (90 dpi, palette-optimised: < 200 kB for ten panels); return its path."""
    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.7 * ncols, 3.0 * nrows + 0.5), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for s in panel.series:
            ax.plot(list(s.x), list(s.y), marker="o", markersize=3, linewidth=1.3, label=s.label, color=s.color)
        for value, label in panel.hlines:
            ax.axhline(value, linestyle="--", linewidth=1, color="grey")
            ax.annotate(label, (0.01, value), xycoords=("axes fraction", "data"), fontsize=6, va="bottom")
        for i, m in enumerate(panel.marks):
            ax.plot(
                [m.x],
                [m.y],
                marker="*",
                markersize=10,
                color="black",
                linestyle="none",
                label="paper" if i == 0 else None,
            )
            if m.label != "paper":
                ax.annotate(m.label, (m.x, m.y), textcoords="offset points", xytext=(4, -8), fontsize=6)
        if panel.vline is not None:
            ax.axvline(panel.vline, linestyle=":", linewidth=1, color="black", label=panel.vline_label)
        if panel.log_y:
            ax.set_yscale("log")
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, pil_kwargs={"optimize": True})
    plt.close(fig)
    return path
