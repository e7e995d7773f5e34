"""Simulation scenarios: cluster, model catalog, trace and policy, validated field by field.

A scenario is a small YAML or JSON file. Every refusal names the field, e.g.
`scenario.yaml: cluster.unit_memory_mb: must be a positive number, got -1`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from faas_gpu.paths import REPO_ROOT
from faas_gpu.policies import Model

# GPU-FaaS paper, Table I: GPU occupation (MB) at batch 32, loading time (s), inference time (s)
GPU_FAAS_TABLE1 = [
    ("squeezenet1.1", 1269, 2.41, 1.28),
    ("resnet18", 1313, 2.52, 1.25),
    ("resnet34", 1357, 2.60, 1.25),
    ("squeezenet1.0", 1435, 2.32, 1.33),
    ("alexnet", 1437, 2.81, 1.25),
    ("resnext50_32x4d", 1555, 2.64, 1.29),
    ("densenet121", 1601, 2.49, 1.28),
    ("densenet169", 1631, 2.56, 1.30),
    ("densenet201", 1665, 2.67, 1.40),
    ("resnet50", 1701, 2.67, 1.28),
    ("resnet101", 1757, 2.95, 1.30),
    ("resnet152", 1827, 3.10, 1.31),
    ("densenet161", 1919, 2.75, 1.32),
    ("inception_v3", 2157, 4.42, 1.63),
    ("resnext101_32x8d", 2191, 3.51, 1.33),
    ("vgg11", 2903, 3.94, 1.29),
    ("wide_resnet50_2", 3611, 3.16, 1.31),
    ("wide_resnet101_2", 3831, 3.91, 1.32),
    ("vgg13", 3887, 3.98, 1.30),
    ("vgg16", 3907, 4.04, 1.27),
    ("vgg16_bn", 3907, 4.03, 1.26),
    ("vgg19", 3947, 4.07, 1.33),
]
CATALOGS = {"gpu_faas_table1": [Model(n, s, lt, it) for n, s, lt, it in GPU_FAAS_TABLE1]}
POLICIES = ("lb", "lalb", "lalb_o3")

KEYS = {"name", "seed", "cluster", "models", "trace", "policy"}
CLUSTER_KEYS = {"nodes", "units_per_node", "unit_memory_mb"}
MODEL_KEYS = {"name", "size_mb", "load_s", "infer_s"}
TRACE_KEYS = {
    "files",
    "file",
    "format",
    "durations",
    "memory",
    "minutes",
    "start_minute",
    "working_set",
    "reuse_functions",
    "scale",
    "mean_requests_per_minute",
    "arrivals",
    "infer_time",
    "max_span_minutes",
    "requests_per_minute",  # refused with a pointer to scale / mean_requests_per_minute
}
TRACE_FORMATS = ("per-minute", "azure2019", "azure2021")
ARRIVALS = ("poisson", "uniform", "recorded")
INFER_TIMES = ("trace", "catalog")
POLICY_KEYS = {"name", "o3_limit"}
MAX_SPAN_MINUTES = 30 * 1440
"""The longest Azure 2021 trace read unless asked for more: 30 days (the published trace is 14);
a stray timestamp would otherwise make a million-minute series of every function."""


class ScenarioError(ValueError):
    pass


CLUSTER_PRESETS = {
    "gpu-faas": "3x4:8GB",  # the GPU-FaaS paper's testbed: 3 nodes x 4 RTX 2080 of 8 GB
    "protean": "8x1:40GB",  # PROTEAN's: 8 worker nodes of one A100-40GB each
}
_CLUSTER_SPEC = re.compile(r"(\d+)\s*x\s*(\d+)\s*:\s*(\d+(?:\.\d+)?)\s*([a-z]*)", re.IGNORECASE)
_MEMORY_UNITS = {"gb": 1024.0, "gib": 1024.0, "g": 1024.0, "mb": 1.0, "mib": 1.0, "m": 1.0}


@dataclass
class Cluster:
    nodes: int
    units_per_node: int
    unit_memory_mb: float


def parse_cluster(spec: str) -> Cluster:
    """`NODESxGPUS:MEMORY` (`3x4:8GB`: 3 nodes of 4 GPUs with 8 GB each; GB = 1024 MB, as GPU
    memory is quoted) or a preset name (`gpu-faas`, `protean`); ValueError says what is wrong."""
    text = CLUSTER_PRESETS.get(spec.strip().lower(), spec.strip())
    m = _CLUSTER_SPEC.fullmatch(text)
    if not m:
        raise ValueError(f"{spec!r} is not NODESxGPUS:MEMORY (e.g. 3x4:8GB) or a preset ({', '.join(CLUSTER_PRESETS)})")
    nodes, gpus, amount, unit = int(m[1]), int(m[2]), float(m[3]), m[4].lower()
    if unit not in _MEMORY_UNITS:
        raise ValueError(f"{spec!r}: the GPU memory needs a unit, GB or MB (e.g. 3x4:8GB)")
    if nodes < 1 or gpus < 1 or amount <= 0:
        raise ValueError(f"{spec!r}: nodes, GPUs per node and memory must be positive")
    return Cluster(nodes, gpus, amount * _MEMORY_UNITS[unit])


@dataclass
class TraceSpec:
    """Which trace, which minutes, and how it is replayed (see `faas_gpu.sim.trace`).

    By default the trace is replayed as recorded: `scale` 1, no function reused. `scale`
    multiplies every minute of every function alike; `mean_requests_per_minute` (the GPU-FaaS
    paper's 325) sets `scale` so the working set's mean rate is that figure, the minute-to-minute
    shape kept. `reuse_functions` allows a working set larger than the trace's functions, by
    taking each function's series again at other start minutes (printed when used).
    """

    files: list[Path]
    format: str  # "per-minute" (one count per line, one function per file), "azure2019" or "azure2021"
    minutes: int
    start_minute: int
    working_set: int
    durations: Path | None = None  # Azure 2019 function_durations_percentiles CSV
    memory: Path | None = None  # Azure 2019 app_memory_allocated CSV
    reuse_functions: bool = False
    scale: float = 1.0
    mean_requests_per_minute: float | None = None
    arrivals: str = "poisson"  # within a minute: "poisson", "uniform" or "recorded" (azure2021 timestamps)
    infer_time: str = "trace"  # a function's inference time: its recorded mean duration where known, or "catalog"
    max_span_minutes: int = MAX_SPAN_MINUTES  # an Azure 2021 trace longer than this is refused (`trace_readers`)


@dataclass
class Scenario:
    name: str
    seed: int
    cluster: Cluster
    models: list[Model]
    trace: TraceSpec
    policy: str
    o3_limit: int = 25
    source: Path | None = field(default=None, compare=False)


class _Check:
    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, msg: str):
        raise ScenarioError(f"{self.file}: {key}: {msg}")

    def keys(self, data: Any, allowed: set[str], where: str) -> dict:
        if not isinstance(data, dict):
            self.fail(where, "must be a mapping")
        unknown = sorted(set(data) - allowed)
        if unknown:
            self.fail(
                f"{where}.{unknown[0]}" if where else unknown[0], f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )
        return data

    def number(
        self,
        data: dict,
        key: str,
        where: str,
        *,
        integer: bool = False,
        minimum: float = 0,
        positive: bool = True,
        default: Any = None,
    ) -> Any:
        value = data.get(key, default)
        path = f"{where}.{key}" if where else key
        if value is None:
            self.fail(path, "is required")
        if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
            self.fail(path, f"must be {'an integer' if integer else 'a number'}, got {value!r}")
        if value < minimum or (positive and value <= 0):
            self.fail(path, f"must be {'positive' if positive else f'>= {minimum}'}, got {value}")
        return value


def _resolve(path: str, base: Path) -> Path:
    p = Path(path)
    if p.is_absolute():
        return p
    for root in (base, REPO_ROOT):
        if (root / p).exists():
            return (root / p).resolve()
    return (base / p).resolve()


def load_scenario(path: Path | str) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path.name}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    scenario = parse_scenario(data, path.name, path.parent.resolve())
    scenario.source = path
    return scenario


def parse_scenario(data: Any, file: str = "scenario", base: Path | None = None) -> Scenario:
    c = _Check(file)
    base = base or Path.cwd()
    c.keys(data, KEYS, "")
    for key in ("cluster", "models", "trace", "policy"):
        if key not in data:
            c.fail(key, "is required")
    seed = c.number(data, "seed", "", integer=True, positive=False, default=1)
    cl = c.keys(data["cluster"], CLUSTER_KEYS, "cluster")
    cluster = Cluster(
        c.number(cl, "nodes", "cluster", integer=True),
        c.number(cl, "units_per_node", "cluster", integer=True),
        float(c.number(cl, "unit_memory_mb", "cluster")),
    )
    models = _models(c, data["models"])
    for m in models:
        if m.size_mb > cluster.unit_memory_mb:
            c.fail(
                f"models.{m.name}.size_mb", f"{m.size_mb} MB is bigger than every unit ({cluster.unit_memory_mb} MB)"
            )
    trace = _trace(c, c.keys(data["trace"], TRACE_KEYS, "trace"), base)
    pol = c.keys(data["policy"], POLICY_KEYS, "policy")
    name = pol.get("name")
    if name not in POLICIES:
        c.fail("policy.name", f"must be one of {', '.join(POLICIES)}, got {name!r}")
    o3 = c.number(pol, "o3_limit", "policy", integer=True, positive=False, default=25)
    return Scenario(str(data.get("name", file)), seed, cluster, models, trace, name, o3)


def sniff_format(path: Path) -> str:
    """A trace's format from its first line: a number is a per-minute count file (one count a
    line), else an Azure CSV's header (2019 invocations, or 2021 per-invocation). A byte-order
    mark is skipped; UnicodeDecodeError for a file that is not text."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        head = next((line for line in fh if line.strip()), "")
    try:
        float(head)
        return "per-minute"
    except ValueError:
        return "azure2021" if "end_timestamp" in head else "azure2019"


def _trace(c: _Check, tr: dict, base: Path) -> TraceSpec:
    if "requests_per_minute" in tr:
        c.fail(
            "trace.requests_per_minute",
            "no longer exists: it rescaled every minute to one figure, flattening bursts and giving idle "
            "functions requests; the trace is now replayed as recorded. Use scale (a factor for every "
            "minute) or mean_requests_per_minute (the factor that gives that mean rate, shape kept)",
        )
    if ("files" in tr) == ("file" in tr):
        c.fail("trace", "give either files (per-minute count files) or file (an Azure 2019 or 2021 CSV)")
    raw_files = tr["files"] if "files" in tr else [tr["file"]]
    if not isinstance(raw_files, list) or not raw_files or not all(isinstance(f, str) for f in raw_files):
        c.fail("trace.files", "must be a non-empty list of paths")
    files = [_resolve(f, base) for f in raw_files]
    for i, f in enumerate(files):
        if not f.is_file():
            c.fail(f"trace.files[{i}]" if "files" in tr else "trace.file", f"{raw_files[i]} not found")
    fmt = tr.get("format") or ("per-minute" if "files" in tr else sniff_format(files[0]))
    if fmt not in TRACE_FORMATS:
        c.fail("trace.format", f"must be one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
    if fmt != "per-minute" and "files" in tr:
        c.fail("trace.files", f"a {fmt} trace is one file: give trace.file")
    extra: dict[str, Path] = {}
    for key in ("durations", "memory"):
        if key in tr:
            if fmt != "azure2019":
                c.fail(f"trace.{key}", "only an Azure 2019 trace has a separate durations or memory file")
            if not isinstance(tr[key], str) or not _resolve(tr[key], base).is_file():
                c.fail(f"trace.{key}", f"{tr[key]!r} not found")
            extra[key] = _resolve(tr[key], base)
    reuse = tr.get("reuse_functions", False)
    if not isinstance(reuse, bool):
        c.fail("trace.reuse_functions", f"must be true or false, got {reuse!r}")
    if "scale" in tr and "mean_requests_per_minute" in tr:
        c.fail("trace.scale", "give scale or mean_requests_per_minute, not both")
    mean_rpm = c.number(tr, "mean_requests_per_minute", "trace") if "mean_requests_per_minute" in tr else None
    arrivals = tr.get("arrivals", "recorded" if fmt == "azure2021" else "poisson")
    if arrivals not in ARRIVALS:
        c.fail("trace.arrivals", f"must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if arrivals == "recorded" and fmt != "azure2021":
        c.fail("trace.arrivals", f"recorded arrival times exist only in an Azure 2021 trace, not {fmt}")
    infer_time = tr.get("infer_time", "trace")
    if infer_time not in INFER_TIMES:
        c.fail("trace.infer_time", f"must be one of {', '.join(INFER_TIMES)}, got {infer_time!r}")
    return TraceSpec(
        files=files,
        format=fmt,
        minutes=c.number(tr, "minutes", "trace", integer=True),
        start_minute=c.number(tr, "start_minute", "trace", integer=True, positive=False, default=0),
        working_set=c.number(tr, "working_set", "trace", integer=True),
        durations=extra.get("durations"),
        memory=extra.get("memory"),
        reuse_functions=reuse,
        scale=float(c.number(tr, "scale", "trace", default=1.0)),
        mean_requests_per_minute=None if mean_rpm is None else float(mean_rpm),
        arrivals=arrivals,
        infer_time=infer_time,
        max_span_minutes=c.number(tr, "max_span_minutes", "trace", integer=True, default=MAX_SPAN_MINUTES),
    )


def parse_models(raw: Any, file: str = "models") -> list[Model]:
    """A catalogue name or a list of {name, size_mb, load_s, infer_s}; errors name the entry."""
    return _models(_Check(file), raw)


def _models(c: _Check, raw: Any) -> list[Model]:
    if isinstance(raw, str):
        if raw not in CATALOGS:
            c.fail("models", f"unknown catalog {raw!r} (known: {', '.join(CATALOGS)})")
        return list(CATALOGS[raw])
    if not isinstance(raw, list) or not raw:
        c.fail("models", "must be a catalog name or a non-empty list of models")
    out, seen = [], set()
    for i, m in enumerate(raw):
        where = f"models[{i}]"
        c.keys(m, MODEL_KEYS, where)
        name = m.get("name")
        if not isinstance(name, str) or not name:
            c.fail(f"{where}.name", "is required")
        if name in seen:
            c.fail(f"{where}.name", f"duplicate model {name!r}")
        seen.add(name)
        where = f"models.{name}"
        out.append(
            Model(
                name,
                float(c.number(m, "size_mb", where)),
                float(c.number(m, "load_s", where, positive=False)),
                float(c.number(m, "infer_s", where)),
            )
        )
    return out
