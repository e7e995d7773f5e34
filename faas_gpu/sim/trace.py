"""From an invocation trace to timed requests, replayed as recorded.

1. The trace's functions are read as recorded (`trace_readers`: per-minute count files, the Azure
   Functions 2019 CSVs, the Azure Functions 2021 per-invocation trace).
2. The working set is the top-k functions by invocations in the simulated minutes. Asking for
   more functions than the trace holds is an error naming both numbers, unless the scenario sets
   `reuse_functions`: then each function's series is taken again at other start minutes spread
   over the trace (each window a function of its own) and the top-k of those windows is the
   working set — a choice printed with the run, never silent. A window (or a function) with no
   invocation in the simulated minutes is never a member: a working set is the functions that
   are called, so a sparse trace may give fewer than asked for, and the notes say how many.
3. Each function gets the invocations its trace records, minute by minute: a burst minute stays a
   burst, an idle minute or function stays idle. An explicit `scale` multiplies every minute of
   every function alike; counts are rounded per function on the running sum (round half up), so
   a function's total is its recorded total × scale and an idle minute stays at 0. Fractional
   recorded counts are rounded the same way (said in the notes); a function whose every minute
   rounds to 0 leaves the working set (said too), and a scale that leaves no request at all is
   an error naming `scale`.
   `mean_requests_per_minute` is the GPU-FaaS paper's set-up (325/min): the scale that makes the
   working set's mean rate that figure, the shape kept.
4. Functions map to models. Without memory figures, sizes are spread evenly over the popularity
   ranks (models sorted by size, stepped through with a stride coprime to their count). With the
   Azure 2019 memory file, a function's memory quantile in the working set picks the model at the
   same size quantile (bigger functions, bigger models): the catalogue's GPU sizes and load times
   stay, as no trace records a GPU footprint. A function's recorded mean duration becomes its
   inference time (`infer_time: trace`, the default where the trace has durations;
   `infer_time: catalog` keeps the model's). Past the catalogue's size a model is reused under a
   new name (`vgg19#2`), a distinct cache item with the same profile, so the working set is k
   distinct models, as in the paper.
5. Arrivals inside a minute: `poisson` (a Poisson process holding the minute's count: the count's
   times uniform at random, seeded), `uniform` (evenly spaced, 60/n s apart, at a seeded phase) or
   `recorded` (the Azure 2021 timestamps; under a scale, the recorded times are repeated or a
   seeded subset taken).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from faas_gpu.policies import Model

from .scenario import ScenarioError, TraceSpec
from .trace_readers import TraceFunction, read_azure2019, read_azure2021, read_per_minute

MIN_INFER_S = 0.001  # Azure records durations of 0 ms; a job takes at least a millisecond here


@dataclass(frozen=True)
class Arrival:
    time: float
    model: str


@dataclass
class Window:
    """A working-set function: one function's invocations over the simulated minutes."""

    name: str
    counts: np.ndarray  # per simulated minute, as recorded
    times: np.ndarray | None  # arrival times in seconds from the window's start (2021 only)
    duration_s: float | None
    memory_mb: float | None
    start: int = 0  # the trace minute the window starts at


@dataclass
class Workload:
    """The simulated requests and how they came from the trace."""

    arrivals: list[Arrival]
    models: list[Model]  # one per working-set function, in popularity order
    functions: list[str]  # the trace function (or window) behind each model
    recorded: np.ndarray  # functions x minutes: the trace's invocations
    counts: np.ndarray  # functions x minutes: the requests generated (recorded x scale)
    scale: float
    notes: list[str] = field(default_factory=list)  # choices to print with the run
    starts: list[int] = field(default_factory=list)  # per function, the trace minute its window starts at

    def arrival_counts(self) -> np.ndarray:
        """Functions x minutes counted from the arrivals themselves (the check against the trace)."""
        index = {m.name: i for i, m in enumerate(self.models)}
        out = np.zeros(self.counts.shape, dtype=int)
        for a in self.arrivals:
            out[index[a.model], int(a.time // 60)] += 1
        return out


def read_trace(spec: TraceSpec, notes: list[str] | None = None, until_minute: int | None = None) -> list[TraceFunction]:
    """The trace's functions; `notes` gets what the reader assumed (columns ignored, the span).
    `until_minute`: the end of the minutes to replay, when known (a 2021 trace is read up to it)."""
    if spec.format == "azure2019":
        return read_azure2019(spec.files[0], spec.durations, spec.memory, notes)
    if spec.format == "azure2021":
        return read_azure2021(spec.files[0], notes, max_span_minutes=spec.max_span_minutes, until_minute=until_minute)
    return read_per_minute(spec.files)


def _window(f: TraceFunction, start: int, minutes: int, name: str) -> Window:
    times = None
    if f.times is not None:
        lo, hi = start * 60.0, (start + minutes) * 60.0
        times = f.times[(f.times >= lo) & (f.times < hi)] - lo
    return Window(name, f.counts[start : start + minutes], times, f.duration_s, f.memory_mb, start)


def select_functions(spec: TraceSpec, functions: list[TraceFunction]) -> tuple[list[Window], list[str]]:
    """The working set (top-k by invocations in the simulated minutes) and the notes on how."""
    lo, hi = spec.start_minute, spec.start_minute + spec.minutes
    for f in functions:
        if hi > f.minutes:
            raise ScenarioError(f"trace.minutes: {f.name} has {f.minutes} minutes, asked for {lo}..{hi}")
    n, ws = len(functions), spec.working_set
    notes = []
    if ws <= n:
        candidates = [_window(f, lo, spec.minutes, f.name) for f in functions]
    elif not spec.reuse_functions:
        raise ScenarioError(
            f"trace.working_set: {ws} functions asked for, the trace holds {n}; "
            "set trace.reuse_functions: true (faas-gpu sim --reuse-functions) to take functions again "
            "from other minutes of the trace"
        )
    else:
        copies = math.ceil(2 * ws / n)
        candidates, starts = [], set()
        for f in functions:
            stride = max(spec.minutes, (f.minutes - hi) // copies)
            # distinct start minutes only: a trace no longer than the window has no other minutes to
            # take, and the same window twice would be one function's load sent twice, not a new one
            room = f.minutes - hi + 1  # the start minutes there are: lo .. f.minutes - spec.minutes
            picked = list(dict.fromkeys(lo + (k * stride) % room for k in range(copies)))
            if len(picked) < copies:  # a short trace whose stride wrapped onto taken minutes: fill in order
                picked += [s for s in range(lo, lo + room) if s not in picked][: copies - len(picked)]
            for start in picked:
                starts.add(start)
                candidates.append(_window(f, start, spec.minutes, f.name if start == lo else f"{f.name}@{start}"))
        if len(candidates) < ws:
            raise ScenarioError(
                f"trace.working_set: {ws} functions asked for; the trace's {n} functions give only "
                f"{len(candidates)} distinct {spec.minutes}-minute windows (start minutes "
                f"{', '.join(str(s) for s in sorted(starts))}); replay fewer minutes or ask for fewer functions"
            )
        notes.append(
            f"trace: working set {ws} > the trace's {n} functions; reusing each function's series at start "
            f"minutes {', '.join(str(s) for s in sorted(starts))}, the top {ws} of these {len(candidates)} windows "
            "by invocations (trace.reuse_functions)"
        )
    totals = np.array([c.counts.sum() for c in candidates])
    top = np.argsort(-totals, kind="stable")[:ws]
    chosen = [candidates[i] for i in top if totals[i] > 0]
    if not chosen:
        raise ScenarioError("trace: no invocations in the simulated minutes (empty trace)")
    if len(chosen) < ws:
        what = "windows" if spec.reuse_functions and ws > n else "functions"
        notes.append(
            f"trace: working set {len(chosen)}, not {ws}: only {len(chosen)} of the {len(candidates)} {what} have "
            f"an invocation in minutes {lo}..{hi} (an empty one would be a function that is never called)"
        )
    return chosen, notes


def scale_counts(recorded: np.ndarray, scale: float) -> np.ndarray:
    """Every minute x scale, rounded per function on the running sum (exact for scale 1, 0 stays 0)."""
    running = np.floor(np.cumsum(recorded * scale, axis=-1) + 0.5)
    return np.diff(running, axis=-1, prepend=0.0).astype(int)


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


def assign_models_by_memory(memory: list[float | None], catalog: list[Model]) -> list[Model]:
    """The function at memory quantile q gets the model at size quantile q (unknown: the median)."""
    known = [m for m in memory if m is not None]
    median = float(np.median(known)) if known else 0.0
    mem = [median if m is None else m for m in memory]
    k, by_size = len(mem), sorted(catalog, key=lambda m: (m.size_mb, m.name))
    order = sorted(range(k), key=lambda i: (mem[i], i))
    picked: list[Model] = [by_size[0]] * k
    for rank, i in enumerate(order):
        picked[i] = by_size[rank * len(by_size) // k]
    seen: dict[str, int] = {}
    out = []
    for m in picked:
        seen[m.name] = seen.get(m.name, 0) + 1
        copy = seen[m.name]
        out.append(m if copy == 1 else Model(f"{m.name}#{copy}", m.size_mb, m.load_s, m.infer_s))
    return out


def _models(spec: TraceSpec, chosen: list[Window], catalog: list[Model], notes: list[str]) -> list[Model]:
    memory = [w.memory_mb for w in chosen]
    if any(m is not None for m in memory):
        models = assign_models_by_memory(memory, catalog)
        unknown = sum(m is None for m in memory)
        notes.append(
            "trace: models picked by the functions' recorded memory (memory quantile -> model size quantile)"
            + (f"; {unknown} function(s) without a memory row take the median" if unknown else "")
        )
    else:
        models = assign_models(len(chosen), catalog)
    timed = [w.duration_s is not None for w in chosen]
    if spec.infer_time == "trace" and any(timed):
        models = [
            Model(m.name, m.size_mb, m.load_s, max(MIN_INFER_S, w.duration_s)) if w.duration_s is not None else m
            for m, w in zip(models, chosen, strict=True)
        ]
        notes.append(
            f"trace: inference time = the recorded mean duration for {sum(timed)} of {len(chosen)} functions "
            "(trace.infer_time: catalog keeps the models')"
        )
    return models


def _spread(rng: np.random.Generator, how: str, n: int, minute: int, recorded: np.ndarray | None) -> np.ndarray:
    lo = minute * 60.0
    # lo + 60 x (a draw just under 1) rounds to the next minute's first instant late in a day; the
    # request would be counted in a minute the trace did not give it (or past the replay's end)
    last = np.nextafter(lo + 60.0, lo)
    if how == "uniform":
        return np.minimum(lo + (np.arange(n) + rng.uniform()) * 60.0 / n, last)
    if how == "recorded":
        assert recorded is not None
        times = recorded[(recorded >= lo) & (recorded < lo + 60.0)]
        if n == len(times):
            return times
        extra = rng.choice(times, size=n % len(times), replace=False)
        return np.concatenate([np.repeat(times, n // len(times)), extra])
    return np.minimum(rng.uniform(lo, lo + 60.0, size=n), last)


def build_workload(
    spec: TraceSpec, catalog: list[Model], seed: int, functions: list[TraceFunction] | None = None
) -> Workload:
    """The scenario's timed requests, sorted by time, and how they came from the trace.

    `functions` is `read_trace(spec)` when the caller has read it already (`faas-gpu sim --trace`
    reads the trace first to size the window and the working set).
    """
    read_notes: list[str] = []
    if functions is None:
        until = None if spec.reuse_functions else spec.start_minute + spec.minutes  # reuse takes other minutes
        functions = read_trace(spec, read_notes, until)
    chosen, notes = select_functions(spec, functions)
    notes[:0] = read_notes
    recorded = np.stack([w.counts for w in chosen])  # k x minutes
    scale = spec.scale
    if spec.mean_requests_per_minute is not None:
        scale = spec.mean_requests_per_minute * spec.minutes / recorded.sum()
        notes.append(
            f"trace: scale {scale:.4g} for a mean of {spec.mean_requests_per_minute:g} requests/minute "
            f"(recorded mean {recorded.sum() / spec.minutes:.1f}/min); every minute multiplied alike"
        )
    elif scale != 1.0:
        notes.append(f"trace: scale {scale:g}; every minute multiplied alike")
    fractional = recorded != np.floor(recorded)
    if fractional.any():
        f, m = (int(i[0]) for i in np.nonzero(fractional))
        notes.append(
            f"trace: {int(fractional.sum())} function-minute(s) have fractional counts (the first: "
            f"{recorded[f, m]:g} for {chosen[f].name} at trace minute {chosen[f].start + m}); each function's "
            "counts are rounded on its running sum (round half up), so its total is kept to the nearest request"
        )
    counts = scale_counts(recorded, scale)
    sent = counts.sum(axis=1)
    if not sent.any():
        raise ScenarioError(
            f"trace.scale: {scale:.4g} rounds every count to 0 ({recorded.sum():g} invocations recorded in the "
            f"simulated minutes x {scale:.4g} = {recorded.sum() * scale:.3g} requests); use a larger scale"
        )
    if not sent.all():
        gone = [chosen[i].name for i in np.nonzero(sent == 0)[0]]
        notes.append(
            f"trace: at scale {scale:.4g} {len(gone)} function(s) round to no request and leave the working set "
            f"({', '.join(gone[:5])}{', ...' if len(gone) > 5 else ''}): working set {int((sent > 0).sum())}"
        )
        keep = np.nonzero(sent > 0)[0]
        chosen, recorded, counts = [chosen[i] for i in keep], recorded[keep], counts[keep]
    models = _models(spec, chosen, catalog, notes)
    rng = np.random.default_rng(seed)
    arrivals: list[Arrival] = []
    for minute in range(spec.minutes):
        for f, n in enumerate(counts[:, minute]):
            if n:
                for t in _spread(rng, spec.arrivals, int(n), minute, chosen[f].times):
                    arrivals.append(Arrival(float(t), models[f].name))
    arrivals.sort(key=lambda a: (a.time, a.model))
    return Workload(
        arrivals, models, [w.name for w in chosen], recorded, counts, scale, notes, [w.start for w in chosen]
    )


def build_arrivals(spec: TraceSpec, catalog: list[Model], seed: int) -> tuple[list[Arrival], list[Model]]:
    """The timed requests of the scenario, sorted by time, and the models they use."""
    w = build_workload(spec, catalog, seed)
    return w.arrivals, w.models
