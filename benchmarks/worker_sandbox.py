"""What the model workers' walls (gpu_manager/isolation.py) cost a worker's start, with and
without them, in one run, interleaved (issue 41; issue 44 wants misses fast).

Figures each way, medians of `--runs`:
- `fresh_s`: a miss with no pooled process: `Worker.start()` of a small torch.export program,
  spawn (interpreter, imports), walls, read, warm-up, until the worker reports ready;
  `fresh_cpu_s`, the CPU (user + system) the worker process spent on it (steadier than the wall
  clock on a shared machine);
- `pooled_s`: a pooled process spawned until it reports warm (torch imported, loader warmed),
  which is what the pool pays off the job's path; `pooled_cpu_s` likewise;
- `enter_ms`: `sandbox.enter` alone, timed inside a spawned child.

Root builds the uid wall too; otherwise the walls are made in a user namespace.

    .venv/bin/python benchmarks/worker_sandbox.py [--runs 7]

Last line: one JSON object {"without": {...}, "with": {...}}.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.models import ModelStore  # noqa: E402
from faas_gpu.walls import enter  # noqa: E402
from gpu_manager import isolation  # noqa: E402
from gpu_manager.worker import Worker, spawn_pooled  # noqa: E402


def _timed_enter(conn, walls) -> None:
    t0 = time.perf_counter()
    enter(walls)
    conn.send(time.perf_counter() - t0)


def enter_ms(walls) -> float:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_timed_enter, args=(child, walls))
    proc.start()
    seconds = parent.recv()
    proc.join()
    return seconds * 1000


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def pooled_s(walls) -> tuple[float, float]:
    t0 = time.perf_counter()
    pooled = spawn_pooled(1, {}, walls=walls)
    kind, _ = pooled.conn.recv()
    assert kind == "warm", kind
    took = time.perf_counter() - t0
    cpu = cpu_s(pooled.proc.pid)
    pooled.conn.close()
    pooled.proc.join(10)
    return took, cpu


def fresh_s(artifact, walls) -> tuple[float, float]:
    worker = Worker(artifact, walls=walls)
    t0 = time.perf_counter()
    worker.start()
    took = time.perf_counter() - t0
    cpu = cpu_s(worker.proc.pid)
    worker.stop()
    return took, cpu


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="faas-gpu-sandbox-bench-", dir="/var/tmp") as tmp:
        home = Path(tmp)
        (home / "secrets").mkdir()
        walls = isolation.worker_walls(home, home / "models")
        store = ModelStore(home / "models", reader_gid=walls.gid if walls.uid is not None else None)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
        program = torch.export.export(model, (torch.randn(2, 64),), dynamic_shapes=({0: torch.export.Dim("b")},))
        buf = io.BytesIO()
        torch.export.save(program, buf)
        artifact = store.put(buf.getvalue())
        runs: dict[str, dict[str, list[float]]] = {name: {} for name in ("without", "with")}
        for _ in range(args.runs):
            for name, w in (("without", None), ("with", walls)):
                figures = runs[name]
                for kind, (wall, cpu) in (("fresh", fresh_s(artifact, w)), ("pooled", pooled_s(w))):
                    figures.setdefault(f"{kind}_s", []).append(wall)
                    figures.setdefault(f"{kind}_cpu_s", []).append(cpu)
                if w is not None:
                    figures.setdefault("enter_ms", []).append(enter_ms(w))
    result = {name: {k: round(statistics.median(v), 4) for k, v in figures.items()} for name, figures in runs.items()}
    for name in ("fresh_s", "pooled_s", "fresh_cpu_s", "pooled_cpu_s"):
        result["with"][f"{name}_ratio"] = round(result["with"][name] / result["without"][name], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
