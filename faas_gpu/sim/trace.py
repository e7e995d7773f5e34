"""From an invocation trace to timed requests: the GPU-FaaS paper's workload recipe (§V-A).

1. Candidate functions: each row of an Azure Functions 2019 CSV, or — for per-minute count
   files of single functions (INFless's Azure extracts) — windows of each file spread over its
   length, each window one candidate function.
2. The working set is the top-k candidates by invocations in the simulated minutes.
3. Each minute's total is scaled to `requests_per_minute` (largest remainder, so it is exact).
4. Functions map to models so that sizes are spread evenly (models sorted by size, stepped
   through with a stride coprime to their count); past the catalog's size a model is reused
   under a new name (`vgg19#2`), a distinct cache item with the same profile, so the working
   set is `k` distinct models as in the paper.
5. Arrivals fall uniformly at random inside their minute (seeded).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from faas_gpu.policies import Model

from .scenario import ScenarioError, TraceSpec


@dataclass(frozen=True)
class Arrival:
    time: float
    model: str


def _read_per_minute(path: Path) -> np.ndarray:
    values = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            v = float(line)
        except ValueError:
            raise ScenarioError(
                f"trace.files: {path.name} line {lineno}: expected one invocation count per line, got {line[:40]!r}"
            ) from None
        if v < 0 or not math.isfinite(v):
            raise ScenarioError(f"trace.files: {path.name} line {lineno}: counts must be >= 0")
        values.append(v)
    if not values:
        raise ScenarioError(f"trace.files: {path.name} is empty")
    return np.array(values)


def _read_azure2019(path: Path) -> list[np.ndarray]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or header[:4] != ["HashOwner", "HashApp", "HashFunction", "Trigger"]:
            raise ScenarioError(
                f"trace.file: {path.name} is not an Azure Functions 2019 CSV "
                "(header HashOwner,HashApp,HashFunction,Trigger,1..1440)"
            )
        rows = []
        for lineno, row in enumerate(reader, 2):
            try:
                rows.append(np.array([float(v) for v in row[4:]]))
            except ValueError:
                raise ScenarioError(f"trace.file: {path.name} line {lineno}: counts must be numbers") from None
    if not rows:
        raise ScenarioError(f"trace.file: {path.name} has no functions")
    return rows


def candidate_functions(spec: TraceSpec) -> list[np.ndarray]:
    """Per-minute counts over the simulated minutes, one array per candidate function."""
    lo, hi = spec.start_minute, spec.start_minute + spec.minutes
    if spec.format == "azure2019":
        rows = _read_azure2019(spec.files[0])
        if hi > len(rows[0]):
            raise ScenarioError(f"trace.minutes: the trace has {len(rows[0])} minutes, asked for {lo}..{hi}")
        return [r[lo:hi] for r in rows]
    series = [_read_per_minute(f) for f in spec.files]
    per_file = max(1, math.ceil(2 * spec.working_set / len(series)))
    out = []
    for s in series:
        if hi > len(s):
            raise ScenarioError(f"trace.minutes: a file has {len(s)} minutes, asked for {lo}..{hi}")
        stride = max(spec.minutes, (len(s) - hi) // per_file)
        for k in range(per_file):
            start = lo + k * stride
            if start + spec.minutes <= len(s):
                out.append(s[start : start + spec.minutes])
    return out


def _scale(counts: np.ndarray, total: int) -> np.ndarray:
    """Integer counts proportional to `counts`, summing exactly to `total` (largest remainder)."""
    s = counts.sum()
    if s == 0:
        base = np.full(len(counts), total // len(counts))
        base[: total - base.sum()] += 1
        return base
    exact = counts * total / s
    out = np.floor(exact).astype(int)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: total - out.sum()]] += 1
    return out


def assign_models(k: int, catalog: list[Model]) -> list[Model]:
    """Model per function rank, sizes spread evenly; reuse past the catalog as new cache items."""
    by_size = sorted(catalog, key=lambda m: (m.size_mb, m.name))
    n = len(by_size)
    stride = next(s for s in range(max(1, n // 3), n + 1) if math.gcd(s, n) == 1)
    out = []
    for i in range(k):
        m = by_size[(i * stride) % n]
        copy = i // n
        out.append(m if copy == 0 else Model(f"{m.name}#{copy + 1}", m.size_mb, m.load_s, m.infer_s))
    return out


def build_arrivals(spec: TraceSpec, catalog: list[Model], seed: int) -> tuple[list[Arrival], list[Model]]:
    """The timed requests of the scenario, sorted by time, and the models they use."""
    candidates = candidate_functions(spec)
    totals = np.array([c.sum() for c in candidates])
    if totals.sum() == 0:
        raise ScenarioError("trace: no invocations in the simulated minutes (empty trace)")
    k = min(spec.working_set, len(candidates))
    top = np.argsort(-totals, kind="stable")[:k]
    counts = np.stack([candidates[i] for i in top])  # k x minutes
    models = assign_models(k, catalog)
    rng = np.random.default_rng(seed)
    arrivals: list[Arrival] = []
    for minute in range(spec.minutes):
        scaled = _scale(counts[:, minute], spec.requests_per_minute)
        for f, n in enumerate(scaled):
            for t in rng.uniform(minute * 60.0, (minute + 1) * 60.0, size=int(n)):
                arrivals.append(Arrival(float(t), models[f].name))
    arrivals.sort(key=lambda a: (a.time, a.model))
    return arrivals, models
