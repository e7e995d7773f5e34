"""CPU per request across the GPU path's processes: the instance's client, the scheduler, the
GPU Manager and its model worker, at 8 and 32 concurrent callers, in one run.

The path is the one a function's handler takes (`faas_gpu.client.remote`, the classify example's
ResNetMini on 3x32x32 inputs, the client's batching at `--max-batch`), against a scheduler and a
GPU Manager (cpu back end, one unit) started as `faas-gpu up` starts them. Each mode runs the
same callers: `lease` (the default: the client asks the scheduler for a placement lease and sends
its batches to the GPU Manager itself) and `scheduler` (every batch through the scheduler,
`FAAS_GPU_LEASES=off`). CPU is read from /proc (user + system) for every process of each
daemon's process group, the worker apart from its manager; the client's is this process's.

    .venv/bin/python benchmarks/hop_cpu.py [--seconds 8] [--max-batch 8]

Last line: one JSON object {mode: {callers: {rps, cpu_ms_per_request: {process: ms}}}}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "functions" / "classify"))

from model import ResNetMini  # noqa: E402

from faas_gpu import client  # noqa: E402
from faas_gpu.credentials import ensure_token  # noqa: E402
from tests.daemon_process import Daemon, wait_units  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, float] | None:
    """(process group, parent, CPU seconds) of `pid`, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[2]), int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def group_cpu(pgid: int) -> tuple[float, float]:
    """CPU seconds of a daemon's process group: (the daemon's processes, its model workers: the
    processes whose parent is in the group and which are not the group's leader or gunicorn's)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            s = _stat(int(entry))
            if s is not None and s[0] == pgid:
                stats[int(entry)] = s
    daemon = workers = 0.0
    leaders = {pgid} | {pid for pid, (_, parent, _) in stats.items() if parent == pgid}  # master, gunicorn worker
    for pid, (_, parent, cpu) in stats.items():
        if pid in leaders or parent not in leaders or parent == pgid:
            daemon += cpu
        else:
            workers += cpu
    return daemon, workers


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def closed_loop(remote, callers: int, seconds: float) -> int:
    done = [0] * callers
    stop = time.perf_counter() + seconds

    def caller(i: int) -> None:
        x = torch.randn(1, 3, 32, 32)
        while time.perf_counter() < stop:
            remote(x)
            done[i] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def measure(remote, manager: Daemon, scheduler: Daemon, callers: int, seconds: float) -> dict:
    closed_loop(remote, callers, 1.0)  # warm: connections, the batch queue's threads
    before = (self_cpu(), group_cpu(scheduler.proc.pid), group_cpu(manager.proc.pid))
    t0 = time.perf_counter()
    n = closed_loop(remote, callers, seconds)
    wall = time.perf_counter() - t0
    after = (self_cpu(), group_cpu(scheduler.proc.pid), group_cpu(manager.proc.pid))
    ms = {
        "client": after[0] - before[0],
        "scheduler": after[1][0] - before[1][0],
        "gpu_manager": after[2][0] - before[2][0],
        "worker": after[2][1] - before[2][1],
    }
    ms = {k: round(v * 1000 / n, 3) for k, v in ms.items()}
    ms["path_without_worker"] = round(ms["client"] + ms["scheduler"] + ms["gpu_manager"], 3)
    ms["total"] = round(ms["path_without_worker"] + ms["worker"], 3)
    return {"rps": round(n / wall, 1), "requests": n, "cpu_ms_per_request": ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--callers", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--modes", nargs="+", default=["scheduler", "lease"])
    a = ap.parse_args()
    torch.manual_seed(0)
    model = ResNetMini().eval()
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buf)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="faas-gpu-hops-") as tmp:
        home = Path(tmp)
        token = ensure_token(home / "secrets")
        manager = Daemon("gpu_manager", home, "--units", "1", "--unit-memory-mb", "1024", "--worker-threads", "1")
        scheduler = Daemon("scheduler", home)
        try:
            wait_units(scheduler.url, {"Authorization": f"Bearer {token}"}, 1)
            os.environ.update(
                FAAS_GPU_SCHEDULER_URL=scheduler.url,
                FAAS_GPU_TOKEN=token,
                FAAS_GPU_MAX_BATCH=str(a.max_batch),
                FAAS_GPU_BATCH_TIMEOUT_MS="2",
            )
            for mode in a.modes:
                os.environ["FAAS_GPU_LEASES"] = "off" if mode == "scheduler" else "on"
                remote = client.remote(model)
                remote._artifact = buf.getvalue()
                remote(torch.randn(1, 3, 32, 32))
                out[mode] = {}
                for callers in a.callers:
                    r = measure(remote, manager, scheduler, callers, a.seconds)
                    out[mode][callers] = r
                    cpu = r["cpu_ms_per_request"]
                    print(f"{mode:9s} {callers:3d} callers: {r['rps']:7.1f} rps  cpu ms/request {cpu}")
        finally:
            scheduler.kill()
            manager.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
