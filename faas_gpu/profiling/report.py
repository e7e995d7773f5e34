"""Predicted vs measured latency, as INFless's Figure 8: |P^ - P| / P per configuration and the mean;
and whether the machine was quiet enough for the measurements to mean anything.

P^ is the operator combination alone (no offset, as in the paper's figure); P is the model
measured end to end at the same configuration. Only configurations that have both count.

A profile taken on a busy machine (other processes on the same cores) can be off by 10x: the
operators and the whole model are timed at different moments of the contention. Two signs say
so, and `noise_verdict` turns them into what the user reads: the spread of a configuration's
repeats (interquartile range over the median; a quiet CPU keeps it within a few percent) above
`max_spread`, and a prediction off by more than `MAX_ERROR` (2x). Both are judged after the
noisy configurations have been measured again (`profile_model`'s `retries`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .graph import OpGraph
from .store import Config, ProfileStore

DEFAULT_MAX_SPREAD = 0.3
"""A configuration whose repeats spread more than this (IQR / median) was measured on a busy machine."""
MAX_ERROR = 1.0
"""A prediction off by more than 100%: the operators and the model were timed under different loads."""


def spread(samples: list[float]) -> float:
    """(Q3 - Q1) / median of one configuration's repeats; 0 for fewer than 2 samples."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    if med <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / med


@dataclass(frozen=True)
class ReportRow:
    batch: int
    threads: int
    device: str
    share: int
    predicted_ms: float
    measured_ms: float
    spread: float | None = None  # of the repeats, (Q3 - Q1) / median, when this run measured it

    @property
    def error(self) -> float:
        """|P^ - P| / P."""
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def config(self) -> Config:
        return (self.batch, self.threads, self.device, self.share)


@dataclass(frozen=True)
class ErrorReport:
    model: str
    rows: list[ReportRow]

    @property
    def mean_error(self) -> float:
        return statistics.fmean(r.error for r in self.rows) if self.rows else float("nan")

    def table(self) -> str:
        with_spread = any(r.spread is not None for r in self.rows)
        head = f"{'batch':>5} {'threads':>7} {'device':>6} {'share':>5} {'predicted':>10} {'measured':>10} {'error':>7}"
        lines = [head + (f" {'spread':>7}" if with_spread else "")]
        for r in self.rows:
            line = (
                f"{r.batch:>5} {r.threads:>7} {r.device:>6} {r.share:>5} {r.predicted_ms:>8.3f}ms"
                f" {r.measured_ms:>8.3f}ms {r.error * 100:>6.1f}%"
            )
            if with_spread:
                line += f" {r.spread * 100:>6.1f}%" if r.spread is not None else f" {'-':>7}"
            lines.append(line)
        summary = f"{self.model}: mean error {self.mean_error * 100:.1f}% over {len(self.rows)} configurations"
        spreads = [r.spread for r in self.rows if r.spread is not None]
        if spreads:
            summary += (
                f"; repeats spread by {statistics.median(spreads) * 100:.1f}% (median), "
                f"{max(spreads) * 100:.1f}% at most (interquartile range over the median)"
            )
        lines.append(summary)
        return "\n".join(lines)


def error_report(store: ProfileStore, model: str, concurrent: bool | None = None) -> ErrorReport:
    """Per (batch, threads, device, share): the operator prediction, the measurement and the error.

    concurrent: the combination rule (see OpGraph.combine); default the graph's own.
    """
    graph = store.graph(model)
    if graph is None:
        raise LookupError(f"no operator graph for model {model!r} in {store.path}")
    measured = store.model_profiles(model)
    ops = {c: store.ops_at(graph.signatures, *c) for c in measured}
    return rows_report(model, graph, ops, measured, concurrent=concurrent)


def rows_report(
    model: str,
    graph: OpGraph,
    ops: dict[Config, dict[str, float]],
    measured: dict[Config, float],
    spreads: dict[Config, float] | None = None,
    concurrent: bool | None = None,
) -> ErrorReport:
    """The report of measurements in hand (a run's, whether or not the store keeps them)."""
    rows = []
    for c, ms in sorted(measured.items()):
        have = ops.get(c, {})
        if have.keys() == graph.signatures and ms > 0:
            rows.append(ReportRow(*c, graph.combine(have, concurrent), ms, (spreads or {}).get(c)))
    return ErrorReport(model, rows)


@dataclass(frozen=True)
class NoiseVerdict:
    noisy: bool
    message: str  # empty when quiet


def _where(c: Config) -> str:
    b, t, d, s = c
    return f"batch {b}, {t} threads, {d}" + (f" at {s}%" if d == "cuda" else "")


def noise_verdict(
    report: ErrorReport,
    spreads: dict[Config, float],
    max_spread: float = DEFAULT_MAX_SPREAD,
    rerun: str = "faas-gpu profile",
) -> NoiseVerdict:
    """Whether these measurements are too noisy to trust, and the words that say why and what to do.

    rerun: the command that profiles this model again (`faas-gpu profile -f stack.yml fn`)."""
    reasons = []
    wide = {c: v for c, v in spreads.items() if v > max_spread}
    if wide:
        worst = max(wide, key=wide.__getitem__)
        reasons.append(
            f"{len(wide)} of {len(spreads)} configurations varied by more than {max_spread * 100:.0f}% between "
            f"repeats, even measured again (worst {wide[worst] * 100:.0f}% at {_where(worst)})"
        )
    off = [r for r in report.rows if r.error > MAX_ERROR]
    if off:
        worst_row = max(off, key=lambda r: r.error)
        reasons.append(
            f"{len(off)} of {len(report.rows)} predictions are off by more than {MAX_ERROR * 100:.0f}% "
            f"(worst {worst_row.error * 100:.0f}% at {_where(worst_row.config)})"
        )
    if not reasons:
        return NoiseVerdict(False, "")
    return NoiseVerdict(
        True,
        f"{report.model}: this machine was too busy to profile: {'; '.join(reasons)}. The operators and the "
        f"model were timed under different loads, so these figures can be off by 10x. Run `{rerun} --remeasure` "
        f"when the machine is idle (stop other jobs, builds and load tests), or with more repeats (--repeat 20).",
    )
