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

What a reader had to assume is said, not done silently: each reader appends a line to `notes`
(printed with the run) for columns it ignored, and the 2021 reader for the time span the trace
covers. A byte-order mark (Excel's UTF-8 CSVs) is skipped. A 2021 trace's span is bounded
(`scenario.MAX_SPAN_MINUTES`, 30 days, twice the published trace's two weeks): a stray timestamp (6e7 s)
would otherwise make every function a million-minute series, and the report a million-minute
drawing. The refusal names the file, the line and the field; `until_minute` (the end of the
minutes a user asked for) reads only what comes before it, whatever comes after.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .scenario import MAX_SPAN_MINUTES, ScenarioError

AZURE2019_HEAD = ["HashOwner", "HashApp", "HashFunction", "Trigger"]
AZURE2021_COLUMNS = ("app", "func", "end_timestamp", "duration")
STRAY_GAP_MINUTES = 1440
"""A latest invocation this long after any other, and past half the span, is pointed at as a stray."""
ENCODING = "utf-8-sig"
"""UTF-8, a leading byte-order mark skipped (a CSV saved by Excel starts with one)."""


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
    functions = [TraceFunction(p.stem, _per_minute_series(p)) for p in paths]
    _unique_names(functions)  # 1.txt of two folders
    return functions


def _per_minute_series(path: Path) -> np.ndarray:
    values = []
    try:
        text = path.read_text(encoding=ENCODING)
    except UnicodeDecodeError:
        raise ScenarioError(f"trace.files: {path.name} is not text (one invocation count per line)") from None
    for lineno, line in enumerate(text.splitlines(), 1):
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


def _number(text: str | None, where: str) -> float:
    if text is None or not text.strip():
        raise ScenarioError(f"{where}: missing (the row is shorter than the header)")
    try:
        v = float(text)
    except ValueError:
        raise ScenarioError(f"{where}: expected a number, got {text[:40]!r}") from None
    if v < 0 or not math.isfinite(v):
        raise ScenarioError(f"{where}: must be >= 0, got {text[:40]!r}")
    return v


def _numbers(cells: list[str], where: str) -> np.ndarray:
    """A row of per-minute counts, parsed at numpy's speed (a day's CSV is ~46 k rows x 1440
    minutes); an error names the minute's column."""
    try:
        values = np.asarray(cells, dtype=float)
    except ValueError:
        values = np.array([_number(v, f"{where}: minute {m}") for m, v in enumerate(cells, 1)])
    if not (np.isfinite(values) & (values >= 0)).all():
        m, bad = next(
            (m, c) for m, (c, v) in enumerate(zip(cells, values, strict=True), 1) if not (math.isfinite(v) and v >= 0)
        )
        raise ScenarioError(f"{where}: minute {m}: must be >= 0, got {bad[:40]!r}")
    return values


def read_azure2019(
    invocations: Path,
    durations: Path | None = None,
    memory: Path | None = None,
    notes: list[str] | None = None,
) -> list[TraceFunction]:
    """The day's functions from the invocations CSV, with durations and memory joined where given.

    The minute columns are the header's `1, 2, ...` after the four keys; columns after the last
    of them whose names are not the next minute are ignored, and `notes` says which."""
    with invocations.open(newline="", encoding=ENCODING) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or header[:4] != AZURE2019_HEAD or len(header) < 5:
            raise ScenarioError(
                f"trace.file: {invocations.name} is not an Azure Functions 2019 CSV "
                "(header HashOwner,HashApp,HashFunction,Trigger,1..1440)"
            )
        width = _minute_columns(header[4:])
        if width == 0:
            raise ScenarioError(
                f"trace.file: {invocations.name} line 1: column 5 is {header[4][:40]!r}, not minute 1 "
                "(header HashOwner,HashApp,HashFunction,Trigger,1..1440)"
            )
        if width < len(header) - 4 and notes is not None:
            extra = header[4 + width :]
            notes.append(
                f"trace: {invocations.name}: {len(extra)} column(s) after minute {width} ignored "
                f"({', '.join(repr(c[:20]) for c in extra[:5])}{', ...' if len(extra) > 5 else ''})"
            )
        keys, functions = [], []
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            where = f"trace.file: {invocations.name} line {lineno}"
            if len(row) != len(header):
                raise ScenarioError(f"{where}: {len(row)} columns, the header has {len(header)}")
            counts = _numbers(row[4 : 4 + width], where)
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


def _minute_columns(names: list[str]) -> int:
    """How many of the columns after the keys are the minutes 1, 2, ... in order."""
    for i, name in enumerate(names):
        if name.strip() != str(i + 1):
            return i
    return len(names)


def _read_keyed(path: Path, field: str, key_columns: tuple[str, ...], value: str) -> dict[tuple[str, ...], float]:
    with path.open(newline="", encoding=ENCODING) as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in (*key_columns, value) if c not in (reader.fieldnames or [])]
        if missing:
            raise ScenarioError(f"{field}: {path.name} lacks the column(s) {', '.join(missing)}")
        return {
            tuple(row[c] or "" for c in key_columns): _number(
                row[value], f"{field}: {path.name} line {lineno}: {value}"
            )
            for lineno, row in enumerate(reader, 2)
        }


def read_azure2021(
    path: Path,
    notes: list[str] | None = None,
    *,
    max_span_minutes: int = MAX_SPAN_MINUTES,
    until_minute: int | None = None,
) -> list[TraceFunction]:
    """One function per (app, func); its invocations' arrival times and mean duration.

    `until_minute`: invocations arriving at or after that minute are not read (counted in a
    note). Otherwise a span longer than `max_span_minutes` is refused, naming the line of the
    latest invocation. `notes` gets the span read and any column ignored."""
    with path.open(newline="", encoding=ENCODING) as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or any(c not in reader.fieldnames for c in AZURE2021_COLUMNS):
            raise ScenarioError(
                f"trace.file: {path.name} is not an Azure Functions 2021 trace (header app,func,end_timestamp,duration)"
            )
        extra = [c for c in reader.fieldnames if c not in AZURE2021_COLUMNS]
        if extra and notes is not None:
            notes.append(
                f"trace: {path.name}: column(s) {', '.join(repr(c[:20]) for c in extra[:5])} ignored "
                f"(read: {','.join(AZURE2021_COLUMNS)})"
            )
        starts: dict[tuple[str, str], list[float]] = {}
        spent: dict[tuple[str, str], float] = {}
        calls: dict[tuple[str, str], int] = {}
        last = second = (-1.0, 0)  # the two latest arrivals (s) and their lines
        later = 0
        until_s = None if until_minute is None else until_minute * 60.0
        for lineno, row in enumerate(reader, 2):
            where = f"trace.file: {path.name} line {lineno}"
            if None in row:  # more cells than the header names
                raise ScenarioError(
                    f"{where}: {len(reader.fieldnames) + len(row[None])} columns, the header has "
                    f"{len(reader.fieldnames)}"
                )
            for column in AZURE2021_COLUMNS[:2]:
                if not row[column]:
                    raise ScenarioError(f"{where}: {column}: missing (the row is shorter than the header)")
            end = _number(row["end_timestamp"], f"{where}: end_timestamp")
            duration = _number(row["duration"], f"{where}: duration")
            start = max(0.0, end - duration)
            key = (row["app"], row["func"])
            spent[key] = spent.get(key, 0.0) + duration  # a function's mean duration is over the whole trace
            calls[key] = calls.get(key, 0) + 1
            if until_s is not None and start >= until_s:
                later += 1
                continue
            if start > second[0]:
                last, second = ((start, lineno), last) if start > last[0] else (last, (start, lineno))
            starts.setdefault(key, []).append(start)
    if not starts:
        raise ScenarioError(
            f"trace.file: {path.name} has no invocations" + (f" before minute {until_minute}" if later else "")
        )
    last_line, last = last[1], last[0]
    minutes = int(last // 60) + 1
    if later:  # the trace goes on past the minutes asked for: it has them all
        minutes = max(minutes, until_minute or 0)
    if until_minute is None and minutes > max_span_minutes:
        raise ScenarioError(
            f"trace.file: {path.name} line {last_line}: end_timestamp: an arrival at second {last:.6g} makes the "
            f"trace {minutes:,} minutes long ({minutes / 1440:,.0f} days), over the limit of {max_span_minutes:,} "
            f"({max_span_minutes / 1440:g} days): a stray timestamp? Give the minutes to replay "
            "(--minutes) or raise the limit (--max-span-minutes)"
        )
    if notes is not None:
        count = sum(len(t) for t in starts.values())
        first = min(min(t) for t in starts.values())
        notes.append(
            f"trace: {path.name}: {count:,} invocations of {len(starts)} function(s), arrivals from second "
            f"{first:.6g} to {last:.6g}: {minutes:,} minutes"
            + (f"; {later:,} invocation(s) at or after minute {until_minute} not read" if later else "")
        )
        gap = (last - second[0]) / 60.0 if second[1] else 0.0
        if gap > max(minutes / 2, STRAY_GAP_MINUTES):
            notes.append(
                f"warning: {path.name} line {last_line}: the latest invocation (second {last:.6g}) comes "
                f"{gap:,.0f} minutes after any other; the span includes that gap (a stray timestamp?)"
            )
    out = []
    for (app, func), times in starts.items():
        t = np.sort(np.array(times))
        counts = np.bincount((t // 60).astype(int), minlength=minutes).astype(float)
        out.append(
            TraceFunction(f"{app[:6]}-{func[:6]}", counts, times=t, duration_s=spent[(app, func)] / calls[(app, func)])
        )
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
