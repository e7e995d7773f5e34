"""INFless's profile files, read in one place (the predictor, the simulator and the sim back end).

`<model>-profile-results.txt`: one row per measured configuration, `<model> <cpuThreads> <gpuSM%>
<batch> <latency_ms>`; SM 0 is the CPU alone, and INFless writes >= 9000 ms for a configuration
that saturates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

INFEASIBLE_MS = 9000.0
PROFILE_SUFFIX = "-profile-results.txt"


@dataclass(frozen=True)
class ProfileRow:
    """One measured configuration: CPU threads, GPU SM share (%), batch size, batch latency (ms)."""

    cpu: int
    gpu: int
    batch: int
    ms: float

    @property
    def feasible(self) -> bool:
        return self.ms < INFEASIBLE_MS


def load_profile(path: Path | str) -> list[ProfileRow]:
    """Every row of one file, infeasible ones included; a bad row raises ValueError naming file and line.

    A file named `<model>-profile-results.txt` must hold only that model's rows."""
    path = Path(path)
    model = path.name.removesuffix(PROFILE_SUFFIX) if path.name.endswith(PROFILE_SUFFIX) else None
    rows: list[ProfileRow] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 5 or (model is not None and parts[0] != model):
                raise ValueError
            row = ProfileRow(int(parts[1]), int(parts[2]), int(parts[3]), float(parts[4]))
            if row.cpu < 1 or row.batch < 1 or not 0 <= row.gpu <= 100 or not row.ms > 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{path.name} line {lineno}: expected '{model or '<model>'} <cpuThreads> <gpuSM%> <batch> "
                f"<latency_ms>', got {line.strip()!r}"
            ) from None
        rows.append(row)
    return rows
