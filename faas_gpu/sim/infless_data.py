"""Loaders for INFless's published inputs (the `infless/` folder of the shared data; see its README).

- profiles: `profiler/<model>-profile-results.txt`, rows `<model> <cpuThreads> <gpuSM%> <batch> <latency_ms>`
  (SM 0 = CPU only; >= 9000 ms = infeasible), turned into the policies' `Candidate`s;
- the Azure per-minute traces (`workload/azure_7day_per_minute/{1..4}.txt`, 10,080 minutes each),
  or any trace the simulator reads, one keep-alive trace per function (`load_keepalive_traces`);
- the Sporadic / Periodic / Bursty 10-minute means (`workload/<Pattern>.txt`);
- the cluster (`config/clusterCapConfig-dev.yml`).

The folder is an argument everywhere (default `$FAAS_GPU_INFLESS_DATA`, else `shared/data/infless` beside the checkout,
`faas_gpu.paths.SHARED_DATA`):
CI has no shared data, so tests write small files in the same formats.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from faas_gpu.infless_profiles import INFEASIBLE_MS, PROFILE_SUFFIX, ProfileRow, load_profile
from faas_gpu.paths import SHARED_DATA
from faas_gpu.policies.infless import Candidate, Server

__all__ = ["INFEASIBLE_MS", "PROFILE_SUFFIX", "ProfileRow", "load_profile"]  # re-exported for the simulator

DEFAULT_DIR = SHARED_DATA / "infless"
PATTERNS = ("Sporadic", "Periodic", "Bursty")  # the README: 10-minute means of Azure traces 2, 3, 4


def data_dir(path: Path | str | None = None) -> Path:
    """The INFless data folder: `path`, else $FAAS_GPU_INFLESS_DATA, else the shared copy."""
    if path is not None:
        return Path(path)
    env = os.environ.get("FAAS_GPU_INFLESS_DATA")
    return Path(env) if env else DEFAULT_DIR


def load_profiles(
    directory: Path | str | None = None, models: Iterable[str] | None = None
) -> dict[str, list[ProfileRow]]:
    """model -> rows, for `models` (default: every profile file in `<dir>/profiler`)."""
    folder = data_dir(directory) / "profiler"
    if models is None:
        models = sorted(p.name.removesuffix(PROFILE_SUFFIX) for p in folder.glob(f"*{PROFILE_SUFFIX}"))
    out = {m: load_profile(folder / f"{m}{PROFILE_SUFFIX}") for m in models}
    if not out:
        raise FileNotFoundError(f"{folder}: no <model>{PROFILE_SUFFIX} files")
    return out


def candidates(
    rows: Iterable[ProfileRow],
    *,
    offset: float = 1.10,
    max_batch: int = 32,
    batches: Iterable[int] | None = None,
    gpu_only: bool = False,
) -> list[Candidate]:
    """The predictor's view of a model: feasible rows, latency x `offset` (INFless adds 10%, §3.3).

    `batches` restricts the batch sizes (the no-batching ablation passes {1}); `gpu_only` drops
    CPU-only rows (an OTP system cannot switch between CPU and accelerator, §1).
    """
    allowed = set(batches) if batches is not None else None
    out = []
    for r in rows:
        if not r.feasible or r.batch > max_batch or (allowed is not None and r.batch not in allowed):
            continue
        if gpu_only and r.gpu == 0:
            continue
        out.append(Candidate(r.batch, float(r.cpu), float(r.gpu), r.ms * offset / 1000.0))
    return out


def load_azure_minutes(index: int, directory: Path | str | None = None) -> list[int]:
    """Invocations per minute of Azure trace `index` (1..4), 7 days."""
    path = data_dir(directory) / "workload" / "azure_7day_per_minute" / f"{index}.txt"
    return [int(float(x)) for x in path.read_text().split()]


def load_keepalive_traces(paths: list[Path], top: int = 100) -> tuple[dict[str, list[float]], list[str]]:
    """Per-minute invocation counts of every function of the trace files given (any format the
    simulator reads: per-minute count files, the Azure 2019 invocations CSV, the 2021
    per-invocation CSV), for the keep-alive replay; the `top` busiest when there are more; and the
    notes on what was read. ScenarioError (naming the file, line and field) for a bad file."""
    from .scenario import ScenarioError, TraceSpec, sniff_format
    from .trace import read_trace

    notes: list[str] = []
    functions = []
    for path in paths:
        if not Path(path).is_file():
            raise ScenarioError(f"--keepalive-trace: {path} not found")
        try:
            fmt = sniff_format(Path(path))
        except (UnicodeDecodeError, OSError) as exc:
            raise ScenarioError(f"--keepalive-trace: cannot read {path} as a trace: {exc}") from None
        spec = TraceSpec(files=[Path(path)], format=fmt, minutes=1, start_minute=0, working_set=1)
        functions += read_trace(spec, notes)
    functions = [f for f in functions if f.counts.sum() > 0]
    if not functions:
        raise ScenarioError(f"--keepalive-trace: no invocations in {', '.join(str(p) for p in paths)}")
    if len(functions) > top:
        notes.append(f"keep-alive: the {top} busiest of {len(functions)} functions replayed (--keepalive-top)")
        functions = sorted(functions, key=lambda f: -f.counts.sum())[:top]
    names: dict[str, int] = {}
    traces = {}
    for f in functions:  # functions of several files may share a name
        names[f.name] = names.get(f.name, 0) + 1
        traces[f.name if names[f.name] == 1 else f"{f.name}~{names[f.name]}"] = f.counts.tolist()
    return traces, notes


def load_pattern(name: str, directory: Path | str | None = None) -> list[float]:
    """10-minute means (invocations per minute) of the Sporadic, Periodic or Bursty pattern."""
    if name not in PATTERNS:
        raise ValueError(f"pattern: one of {PATTERNS}, got {name!r}")
    path = data_dir(directory) / "workload" / f"{name}.txt"
    return [float(x) for x in path.read_text().split()]


def active_minutes(counts: Iterable[float]) -> list[int]:
    """The minutes with at least one invocation (the keep-alive policies' history)."""
    return [m for m, c in enumerate(counts) if c > 0]


@dataclass(frozen=True)
class Node:
    """One node of the cluster config: CPU sockets (threads each) and GPUs (memory MB each)."""

    name: str
    socket_threads: tuple[int, ...]
    gpu_memory_mb: tuple[int, ...]

    @property
    def threads(self) -> int:
        return sum(self.socket_threads)


def load_cluster(directory: Path | str | None = None) -> list[Node]:
    """`config/clusterCapConfig-dev.yml`: per node, the listed physical cores of each socket x 2
    (hyper-threads, as the authors' scheduler counts them) and the GPUs with a CUDA index >= 0
    (index -1 is the CPU pseudo-device)."""
    path = data_dir(directory) / "config" / "clusterCapConfig-dev.yml"
    doc = yaml.safe_load(path.read_text())
    nodes = []
    for i, n in enumerate(doc.get("cluster-capacity") or []):
        label = str(n.get("node-label", f"node-{i + 1}"))
        sockets = tuple(2 * len(s.get("socket-core") or []) for s in n.get("cpu-capacity") or [])
        gpus = tuple(int(g["gpu-memory"]) for g in n.get("gpu-capacity") or [] if int(g["cuda-device"]) >= 0)
        nodes.append(Node(label.split("=")[-1], sockets, gpus))
    if not nodes:
        raise ValueError(f"{path}: no cluster-capacity entries")
    return nodes


def slot_servers(nodes: Iterable[Node]) -> list[Server]:
    """One policy `Server` per (CPU socket, GPU) pair, as the authors' scheduler places instances:
    socket j's threads go with GPU j, so an instance takes its CPU and its GPU share from one slot."""
    out = []
    for n in nodes:
        for j, (threads, _mem) in enumerate(zip(n.socket_threads, n.gpu_memory_mb, strict=False)):
            out.append(Server(f"{n.name}/s{j}", float(threads), [100.0]))
    return out


def node_servers(nodes: Iterable[Node]) -> list[Server]:
    """One policy `Server` per node: all its threads and one free share of 100% per GPU."""
    return [Server(n.name, float(n.threads), [100.0] * len(n.gpu_memory_mb)) for n in nodes]
