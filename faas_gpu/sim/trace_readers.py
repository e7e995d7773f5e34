"""Readers for the invocation traces the simulator replays, each into one `TraceFunction` per function.

Three formats, read as recorded (nothing rescaled or filled in here):

- **per-minute**: one invocation count per line, one function per file (INFless's extracts of the
  Azure 2019 trace, `../shared/data/infless/workload/azure_7day_per_minute/`).
- **Azure Functions 2019** (`AzureFunctionsDataset2019`): `invocations_per_function_md.anon.dNN.csv`
  (HashOwner, HashApp, HashFunction, Trigger, then one column per minute 1..1440), and optionally
  the same day's `function_durations_percentiles.anon.dNN.csv` (per function: Average, Count,
  Minimum, Maximum and percentiles, in milliseconds) and `app_memory_allocated.anon.dNN.csv`
  (per *application*: AverageAllocatedMb and percentiles). Durations join on owner, app and
  function; memory joins on owner and app, so every function of an app gets the app's memory.
- **Azure Functions 2021** (`AzureFunctionsInvocationTraceForTwoWeeksJan2021`): one row per
  invocation, `app,func,end_timestamp,duration` in seconds from the trace's start. An invocation
  arrives at end_timestamp − duration; one that started before the trace's first second (its
  start would be negative) is counted at second 0, so no recorded invocation is lost.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .scenario import ScenarioError

AZURE2019_HEAD = ["HashOwner", "HashApp", "HashFunction", "Trigger"]
AZURE2021_COLUMNS = ("app", "func", "end_timestamp", "duration")


@dataclass
class TraceFunction:
    """One function of a trace: its invocations per minute over the whole trace, as recorded."""

    name: str
    counts: np.ndarray  # invocations per minute, from the trace's minute 0
    times: np.ndarray | None = None  # per-invocation arrival times (s from the trace's start), sorted; 2021 only
    duration_s: float | None = None  # the function's mean recorded duration
    memory_mb: float | None = None  # the function's (2019: its application's) mean allocated memory

    @property
    def minutes(self) -> int:
        return len(self.counts)


def read_per_minute(paths: list[Path]) -> list[TraceFunction]:
    return [TraceFunction(p.stem, _per_minute_series(p)) for p in paths]


def _per_minute_series(path: Path) -> np.ndarray:
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


def _number(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ScenarioError(f"{where}: expected a number, got {text[:40]!r}") from None
    if v < 0 or not math.isfinite(v):
        raise ScenarioError(f"{where}: must be >= 0, got {text[:40]!r}")
    return v


def _numbers(cells: list[str], where: str) -> np.ndarray:
    """A row of counts, parsed at numpy's speed (a day's CSV is ~46 k rows x 1440 minutes)."""
    try:
        values = np.asarray(cells, dtype=float)
    except ValueError:
        values = np.array([_number(v, where) for v in cells])  # names the bad cell
    if not (np.isfinite(values) & (values >= 0)).all():
        bad = next(c for c, v in zip(cells, values, strict=True) if not (math.isfinite(v) and v >= 0))
        raise ScenarioError(f"{where}: must be >= 0, got {bad[:40]!r}")
    return values


def read_azure2019(invocations: Path, durations: Path | None = None, memory: Path | None = None) -> list[TraceFunction]:
    """The day's functions from the invocations CSV, with durations and memory joined where given."""
    with invocations.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or header[:4] != AZURE2019_HEAD or len(header) < 5:
            raise ScenarioError(
                f"trace.file: {invocations.name} is not an Azure Functions 2019 CSV "
                "(header HashOwner,HashApp,HashFunction,Trigger,1..1440)"
            )
        width = len(header) - 4
        keys, functions = [], []
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            where = f"trace.file: {invocations.name} line {lineno}"
            if len(row) != len(header):
                raise ScenarioError(f"{where}: {len(row)} columns, the header has {len(header)}")
            counts = _numbers(row[4:], where)
            owner, app, func, trigger = row[:4]
            keys.append((owner, app, func))
            functions.append(TraceFunction(f"{func[:10]}-{trigger}", counts[:width]))
    if not functions:
        raise ScenarioError(f"trace.file: {invocations.name} has no functions")
    _unique_names(functions)
    if durations is not None:
        table = _read_keyed(durations, "trace.durations", ("HashOwner", "HashApp", "HashFunction"), "Average")
        for key, f in zip(keys, functions, strict=True):
            ms = table.get(key)
            f.duration_s = None if ms is None else ms / 1000.0
    if memory is not None:
        table = _read_keyed(memory, "trace.memory", ("HashOwner", "HashApp"), "AverageAllocatedMb")
        for key, f in zip(keys, functions, strict=True):
            f.memory_mb = table.get(key[:2])
    return functions


def _read_keyed(path: Path, field: str, key_columns: tuple[str, ...], value: str) -> dict[tuple[str, ...], float]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in (*key_columns, value) if c not in (reader.fieldnames or [])]
        if missing:
            raise ScenarioError(f"{field}: {path.name} lacks the column(s) {', '.join(missing)}")
        return {
            tuple(row[c] for c in key_columns): _number(row[value], f"{field}: {path.name} line {lineno}")
            for lineno, row in enumerate(reader, 2)
        }


def read_azure2021(path: Path) -> list[TraceFunction]:
    """One function per (app, func); its invocations' arrival times and mean duration."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or any(c not in reader.fieldnames for c in AZURE2021_COLUMNS):
            raise ScenarioError(
                f"trace.file: {path.name} is not an Azure Functions 2021 trace (header app,func,end_timestamp,duration)"
            )
        starts: dict[tuple[str, str], list[float]] = {}
        spent: dict[tuple[str, str], float] = {}
        for lineno, row in enumerate(reader, 2):
            where = f"trace.file: {path.name} line {lineno}"
            end = _number(row["end_timestamp"], where)
            duration = _number(row["duration"], where)
            key = (row["app"], row["func"])
            starts.setdefault(key, []).append(max(0.0, end - duration))
            spent[key] = spent.get(key, 0.0) + duration
    if not starts:
        raise ScenarioError(f"trace.file: {path.name} has no invocations")
    minutes = int(max(max(t) for t in starts.values()) // 60) + 1
    out = []
    for (app, func), times in starts.items():
        t = np.sort(np.array(times))
        counts = np.bincount((t // 60).astype(int), minlength=minutes).astype(float)
        out.append(TraceFunction(f"{app[:6]}-{func[:6]}", counts, times=t, duration_s=spent[(app, func)] / len(t)))
    _unique_names(out)
    return out


def _unique_names(functions: list[TraceFunction]) -> None:
    """Short names are cut from hashes, and a function hash recurs under other owners and apps:
    the second and later functions with one name get `~2`, `~3`..., so every row of a report
    (and the per-minute counts a user checks against the trace) names one function."""
    seen: dict[str, int] = {}
    for f in functions:
        seen[f.name] = seen.get(f.name, 0) + 1
        if seen[f.name] > 1:
            f.name = f"{f.name}~{seen[f.name]}"
