"""Predicted vs measured latency, as INFless's Figure 8: |P^ - P| / P per configuration and the mean.

P^ is the operator combination alone (no offset, as in the paper's figure); P is the model
measured end to end at the same configuration. Only configurations that have both count.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .store import ProfileStore


@dataclass(frozen=True)
class ReportRow:
    batch: int
    threads: int
    device: str
    share: int
    predicted_ms: float
    measured_ms: float

    @property
    def error(self) -> float:
        """|P^ - P| / P."""
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass(frozen=True)
class ErrorReport:
    model: str
    rows: list[ReportRow]

    @property
    def mean_error(self) -> float:
        return statistics.fmean(r.error for r in self.rows) if self.rows else float("nan")

    def table(self) -> str:
        lines = [
            f"{'batch':>5} {'threads':>7} {'device':>6} {'share':>5} {'predicted':>10} {'measured':>10} {'error':>7}"
        ]
        for r in self.rows:
            lines.append(
                f"{r.batch:>5} {r.threads:>7} {r.device:>6} {r.share:>5} {r.predicted_ms:>8.3f}ms"
                f" {r.measured_ms:>8.3f}ms {r.error * 100:>6.1f}%"
            )
        lines.append(f"{self.model}: mean error {self.mean_error * 100:.1f}% over {len(self.rows)} configurations")
        return "\n".join(lines)


def error_report(store: ProfileStore, model: str, concurrent: bool | None = None) -> ErrorReport:
    """Per (batch, threads, device, share): the operator prediction, the measurement and the error.

    concurrent: the combination rule (see OpGraph.combine); default the graph's own.
    """
    graph = store.graph(model)
    if graph is None:
        raise LookupError(f"no operator graph for model {model!r} in {store.path}")
    sigs = graph.signatures
    rows = []
    for (b, t, d, s), measured in sorted(store.model_profiles(model).items()):
        ops = store.ops_at(sigs, b, t, d, s)
        if ops.keys() == sigs and measured > 0:
            rows.append(ReportRow(b, t, d, s, graph.combine(ops, concurrent), measured))
    return ErrorReport(model, rows)
