"""`faas-gpu sim`: replay a trace against the placement policies; CSV, PNG and an HTML report.

Two ways in:

- `faas-gpu sim SCENARIO` runs a scenario file (cluster, models, trace, policy; see
  `faas_gpu/sim/scenarios/`).
- `faas-gpu sim --trace FILE.csv --cluster 3x4:8GB` replays an Azure Functions trace of your own
  functions (the 2019 invocations CSV, with `--durations` / `--memory` beside it, or the 2021
  per-invocation CSV; the header tells which; or per-minute count files, one count a line, one
  function a file, `--trace` once per file) against every policy (or `--policies`), so a policy
  can be tried on your load before it is deployed. By default the whole trace, every function it
  invokes, as recorded; `--out` gets `report.html` over the PNGs (latency CDF per policy, misses
  per minute, GPU memory held over time).

What was assumed to read the trace (columns ignored, fractional counts rounded, the span of a 2021
trace, a working set smaller than asked for) is printed before the figures, never done silently;
a bad row is one line naming the file, the line and the field.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tqdm import tqdm

from faas_gpu.policies import Model

from .engine import RunResult, simulate
from .report import write_report
from .scenario import (
    CLUSTER_PRESETS,
    MAX_SPAN_MINUTES,
    POLICIES,
    Cluster,
    Scenario,
    ScenarioError,
    TraceSpec,
    load_scenario,
    parse_cluster,
    parse_models,
    sniff_format,
)
from .trace import Workload, build_workload, read_trace

# a trace reader's error names the scenario key; on the command line the flag is what the user typed
FLAG_OF_KEY = {
    "trace.file": "--trace",
    "trace.durations": "--durations",
    "trace.memory": "--memory",
    "trace.minutes": "--minutes",
    "trace.working_set": "--working-set",
    "trace.arrivals": "--arrivals",
    "trace.scale": "--scale",
    "trace.files": "--trace",
    "trace": "--trace",
}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="faas-gpu sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML or JSON (see faas_gpu/sim/scenarios/); or give --trace")
    own = p.add_argument_group("your own trace (instead of a scenario)")
    own.add_argument(
        "--trace",
        type=Path,
        action="append",
        help="an Azure Functions 2019 invocations CSV or a 2021 per-invocation CSV; or a per-minute count file "
        "(one count a line), --trace once for each such file (one function each)",
    )
    own.add_argument("--durations", type=Path, help="the 2019 function_durations_percentiles CSV of the same day")
    own.add_argument("--memory", type=Path, help="the 2019 app_memory_allocated CSV of the same day")
    p.add_argument(
        "--cluster",
        help=f"NODESxGPUS:MEMORY, e.g. 3x4:8GB (GB = 1024 MB), or a preset: "
        f"{', '.join(f'{k} = {v}' for k, v in CLUSTER_PRESETS.items())}; with --trace the default is gpu-faas, "
        "with a scenario it replaces the scenario's cluster",
    )
    own.add_argument(
        "--models",
        help="a model catalogue name or a YAML/JSON list of {name, size_mb, load_s, infer_s} (default gpu_faas_table1)",
    )
    own.add_argument("--minutes", type=positive_int, help="minutes to replay (default: to the trace's end)")
    own.add_argument("--start-minute", type=int, help="first minute replayed (default 0)")
    own.add_argument(
        "--working-set", type=positive_int, help="the top-k functions by invocations (default: every function invoked)"
    )
    own.add_argument(
        "--arrivals",
        choices=("poisson", "uniform", "recorded"),
        help="arrival times inside a minute (default poisson; recorded = the 2021 trace's timestamps, its default)",
    )
    own.add_argument(
        "--infer-time",
        choices=("trace", "catalog"),
        help="a function's inference time: its recorded mean duration where the trace has one (trace, the "
        "default; the 2021 format and the 2019 --durations file record the function's whole run, up to minutes), "
        "or the model's from --models (catalog)",
    )
    own.add_argument(
        "--max-span-minutes",
        type=positive_int,
        help=f"the longest Azure 2021 trace read without --minutes (default {MAX_SPAN_MINUTES:,}: 30 days); a "
        "stray timestamp otherwise makes a million-minute trace",
    )
    p.add_argument("--seed", type=int, help="arrival times' seed (default 1, or the scenario's)")
    p.add_argument(
        "--policies",
        help=f"comma-separated ({', '.join(POLICIES)}); default the scenario's, or all of them with --trace",
    )
    p.add_argument("--o3-limit", type=non_negative_int, help="skip limit for lalb_o3 (>= 0)")
    p.add_argument("--out", type=Path, default=Path("sim-out"), help="folder for CSV, PNG and HTML (default sim-out)")
    p.add_argument(
        "--scale",
        type=float,
        help="multiply every minute of every function by this factor (default: the scenario's, 1 = as recorded)",
    )
    p.add_argument(
        "--reuse-functions",
        action="store_true",
        help="allow a working set larger than the trace's functions by taking them again at other minutes (printed)",
    )
    p.add_argument("--no-progress", action="store_true")
    return p


def flagged(exc: ScenarioError) -> ScenarioError:
    """A trace reader's `trace.file: ...` as `--trace: ...`, so the message names what was typed."""
    msg = str(exc)
    key = re.match(r"([a-z_.]+): ", msg)
    if key and key[1] in FLAG_OF_KEY:
        return ScenarioError(FLAG_OF_KEY[key[1]] + msg[len(key[1]) :])
    return exc


def trace_scenario(args: argparse.Namespace) -> tuple[Scenario, Workload]:
    """The scenario `--trace` and its flags describe, and its workload (the trace read once)."""
    traces: list[Path] = args.trace
    for flag, paths in (("--trace", traces), ("--durations", [args.durations]), ("--memory", [args.memory])):
        for path in paths:
            if path is not None and not path.is_file():
                raise ScenarioError(f"{flag}: {path} not found")
    args.cluster = args.cluster or "gpu-faas"
    args.models = args.models or "gpu_faas_table1"
    args.start_minute = args.start_minute or 0
    seed = 1 if args.seed is None else args.seed
    cluster = cluster_arg(args.cluster)
    models = parse_models(_models_arg(args.models), "--models")
    check_fit(cluster, models, "--models")
    formats = []
    for path in traces:
        try:
            formats.append(sniff_format(path))
        except (UnicodeDecodeError, OSError) as exc:
            raise ScenarioError(f"--trace: cannot read {path} as a trace: {exc}") from None
    fmt = formats[0]
    if len(traces) > 1 and set(formats) != {"per-minute"}:
        odd = next(p for p, f in zip(traces, formats, strict=True) if f != "per-minute")
        raise ScenarioError(
            f"--trace: several traces are per-minute count files, one function each; {odd.name} is {fmt_name(odd)}"
        )
    if (args.durations or args.memory) and fmt != "azure2019":
        raise ScenarioError("--durations/--memory: only an Azure 2019 trace has these files beside it")
    arrivals = args.arrivals or ("recorded" if fmt == "azure2021" else "poisson")
    if arrivals == "recorded" and fmt != "azure2021":
        raise ScenarioError("--arrivals: recorded arrival times exist only in an Azure 2021 trace")
    if args.scale is not None and not args.scale > 0:
        raise ScenarioError(f"--scale: must be positive, got {args.scale}")
    spec = TraceSpec(
        files=traces,
        format=fmt,
        minutes=1,
        start_minute=args.start_minute,
        working_set=1,
        durations=args.durations,
        memory=args.memory,
        reuse_functions=args.reuse_functions,
        scale=args.scale or 1.0,
        arrivals=arrivals,
        infer_time=args.infer_time or "trace",
        max_span_minutes=args.max_span_minutes or MAX_SPAN_MINUTES,
    )
    notes: list[str] = []
    # a 2021 trace is read up to the minutes asked for (a stray later timestamp costs nothing), but
    # reused functions take windows from the whole trace
    until = args.start_minute + args.minutes if args.minutes and not args.reuse_functions else None
    try:
        functions = read_trace(spec, notes, until)
    except ScenarioError as exc:
        raise flagged(exc) from None
    length = max(f.minutes for f in functions)
    if not 0 <= args.start_minute < length:
        raise ScenarioError(f"--start-minute: the trace has minutes 0..{length - 1}, got {args.start_minute}")
    spec.minutes = args.minutes or length - args.start_minute
    lo, hi = args.start_minute, args.start_minute + spec.minutes
    if hi > length:
        raise ScenarioError(f"--minutes: the trace has {length} minutes, asked for {lo}..{hi}")
    invoked = sum(1 for f in functions if f.counts[lo:hi].sum() > 0)
    if not invoked:
        names = ", ".join(p.name for p in traces)
        raise ScenarioError(f"--trace: no invocations in minutes {lo}..{hi} of {names}")
    spec.working_set = args.working_set or invoked
    name = traces[0].stem if len(traces) == 1 else f"{traces[0].stem}+{len(traces) - 1}"
    scenario = Scenario(name, seed, cluster, models, spec, POLICIES[-1], source=traces[0])
    try:
        workload = build_workload(spec, models, seed, functions)
    except ScenarioError as exc:
        raise flagged(exc) from None
    workload.notes[:0] = notes
    k = len(workload.models)
    reused = spec.reuse_functions and spec.working_set > len(functions)
    members = (
        f"a working set of {k} windows of its {len(functions)} functions"
        if reused
        else (f"{k} of its {len(functions)} functions")
    )
    workload.notes.insert(
        0,
        f"trace: {', '.join(p.name for p in traces)} ({fmt}), minutes {lo}..{hi}, {members} ({invoked} invoked "
        f"in these minutes); cluster {cluster.nodes} node(s) x {cluster.units_per_node} GPU(s) x "
        f"{cluster.unit_memory_mb:g} MB (--cluster {args.cluster}); models {args.models}",
    )
    return scenario, workload


def fmt_name(path: Path) -> str:
    try:
        return {"azure2019": "an Azure 2019 CSV", "azure2021": "an Azure 2021 CSV"}.get(sniff_format(path), "?")
    except (UnicodeDecodeError, OSError):
        return "not text"


def cluster_arg(text: str) -> Cluster:
    try:
        return parse_cluster(text)
    except ValueError as exc:
        raise ScenarioError(f"--cluster: {exc}") from None


def check_fit(cluster: Cluster, models: list[Model], source: str) -> None:
    """Every model of the catalogue must fit one GPU (the policies never split a model)."""
    too_big = [m for m in models if m.size_mb > cluster.unit_memory_mb]
    if too_big:
        big = max(too_big, key=lambda m: m.size_mb)
        raise ScenarioError(
            f"--cluster: {cluster.unit_memory_mb:g} MB per GPU is less than {len(too_big)} model(s) of {source} "
            f"(the largest, {big.name}, takes {big.size_mb:g} MB)"
        )


TRACE_ONLY = (
    "durations",
    "memory",
    "models",
    "minutes",
    "start_minute",
    "working_set",
    "arrivals",
    "infer_time",
    "max_span_minutes",
)


def _models_arg(text: str) -> object:
    """A catalogue name as it is, a file as its parsed list (YAML or JSON)."""
    path = Path(text)
    if not path.suffix:
        return text
    if not path.is_file():
        raise ScenarioError(f"--models: {text} not found")
    import yaml

    try:
        return yaml.safe_load(path.read_text())  # YAML reads JSON too
    except yaml.YAMLError as exc:
        raise ScenarioError(f"--models: {path.name} is not valid YAML or JSON: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.scenario is None and args.trace is None:
            raise ScenarioError("give a scenario file or --trace FILE.csv")
        if args.scenario is not None and args.trace is not None:
            raise ScenarioError(f"--trace: give a scenario file ({args.scenario}) or --trace, not both")
        if args.trace is not None:
            scenario, workload = trace_scenario(args)
            default_policies = list(POLICIES)
        else:
            given = [f"--{k.replace('_', '-')}" for k in TRACE_ONLY if getattr(args, k) is not None]
            if given:
                raise ScenarioError(f"{given[0]}: only with --trace (a scenario file sets it in its trace section)")
            scenario = load_scenario(args.scenario)
            if args.cluster:
                scenario.cluster = cluster_arg(args.cluster)
                check_fit(scenario.cluster, scenario.models, f"{args.scenario}'s models")
            if args.seed is not None:
                scenario.seed = args.seed
            if args.scale is not None:
                if not args.scale > 0:
                    raise ScenarioError(f"--scale: must be positive, got {args.scale}")
                scenario.trace.scale, scenario.trace.mean_requests_per_minute = args.scale, None
            if args.reuse_functions:
                scenario.trace.reuse_functions = True
            workload = build_workload(scenario.trace, scenario.models, scenario.seed)
            default_policies = [scenario.policy]
        policies = args.policies.split(",") if args.policies else default_policies
        for name in policies:
            if name not in POLICIES:
                raise ScenarioError(f"--policies: unknown policy {name!r} ({', '.join(POLICIES)})")
        for note in workload.notes:
            print(note, file=sys.stderr)
        total = len(workload.arrivals) * len(policies)
        results: list[RunResult] = []
        with tqdm(total=total, unit="req", disable=True if args.no_progress else None, file=sys.stderr) as bar:
            for name in policies:
                bar.set_description(name)
                results.append(simulate(scenario, name, args.o3_limit, progress=bar.update, workload=workload))
    except ScenarioError as exc:
        print(f"faas-gpu sim: {exc}", file=sys.stderr)
        return 2
    files = write_report(results, args.out, workload, scenario.name, workload.notes)
    for r in results:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.summary().items()}))
    print_table(results)
    print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)
    return 0


def print_table(results: list[RunResult]) -> None:
    """The per-policy figures for a reader (stdout keeps one JSON line per policy for scripts)."""
    print(f"{'policy':<18} {'requests':>8} {'mean s':>8} {'P99 s':>8} {'miss':>6} {'peak mem':>8}", file=sys.stderr)
    for r in results:
        s = r.summary()
        name = f"{r.policy}(limit {r.o3_limit})" if r.policy == "lalb_o3" else r.policy
        print(
            f"{name:<18} {s['requests']:>8} {s['avg_latency_s']:>8.2f} {s['p99_latency_s']:>8.2f}"
            f" {s['miss_ratio']:>6.3f} {100 * r.peak_memory_ratio:>7.0f}%",
            file=sys.stderr,
        )
