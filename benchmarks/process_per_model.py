"""One process per (model, unit) against one process per unit hosting several models (issue 19).

Measured on the cpu back end (the GPU Manager's real torch workers, one torch thread each):
- `process_mb`: a worker's private memory (USS) with torch imported and no model: the per-process
  overhead a process per model pays once per model (on a GPU add its CUDA context);
- `new_process_load_s`: a cache miss as the manager does it today: spawn, import torch, load
  (`Worker.start`), for a model of `--model-mb` MB;
- `in_process_load_s`: the same artifact loaded into a process that already runs torch (what a
  miss costs when one process hosts the unit's models);
- a crash: a killed worker takes down its one model (the others keep serving); one process per
  unit would lose all `--models` models and reload them one after the other
  (`crash_reload_s_shared` = models x in-process load).
Then, for an 80 GB unit (81559 MiB, NVML's total on an H100 80GB HBM3) and a CUDA context of
500 and 700 MiB, how many models of 100 MB / 500 MB / 2 GB fit each way (weights only; a
model's activations add to both alike), and each way's cap under MPS (48 clients per server).
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UNIT_MIB = 81559
CONTEXTS_MIB = (500, 700)
SIZES_MB = (100, 500, 2048)
MPS_CLIENTS = 48


def fits(unit_mib: float, context_mib: float, model_mb: float) -> dict[str, int]:
    """Models of `model_mb` on one unit: a process (context) each, or one process for all."""
    per_model = int(unit_mib // (context_mib + model_mb))
    shared = int((unit_mib - context_mib) // model_mb)
    return {"process_per_model": per_model, "process_per_model_mps": min(per_model, MPS_CLIENTS), "shared": shared}


def _artifact(model_mb: float, seed: int) -> bytes:
    import torch

    torch.manual_seed(seed)
    layers = max(1, round(model_mb / 4))  # a 1024x1024 float32 Linear is 4 MiB
    m = torch.jit.script(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)]).eval())
    buf = io.BytesIO()
    torch.jit.save(m, buf)
    return buf.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-mb", type=float, default=100)
    p.add_argument("--models", type=int, default=3)
    a = p.parse_args()
    import torch

    from faas_gpu.models import ModelStore
    from gpu_manager.memory import process_uss_mb
    from gpu_manager.worker import Worker

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        store = ModelStore(Path(tmp) / "store")
        artifacts = [store.put(_artifact(a.model_mb, seed)) for seed in range(a.models)]
        workers, starts = [], []
        for art in artifacts:
            t0 = time.perf_counter()
            w = Worker(art, "cpu", 1)
            info = w.start()
            starts.append(time.perf_counter() - t0)
            workers.append(w)
        process_mb = min(w.info.process_mb for w in workers)
        worker_uss = [process_uss_mb(w.proc.pid) for w in workers]
        loads = []
        for art in artifacts:  # into this process, which runs torch already
            t0 = time.perf_counter()
            m = torch.jit.load(str(art.path), map_location="cpu")
            loads.append(time.perf_counter() - t0)
            del m
        x = torch.randn(1, 1024)
        from faas_gpu.contract.wire import encode

        os.kill(workers[0].proc.pid, signal.SIGKILL)
        time.sleep(0.2)
        survivors = 0
        for w in workers[1:]:
            try:
                w.run(encode(x), 30)
                survivors += 1
            except Exception:
                pass
        for w in workers:
            w.stop()
    in_process = sorted(loads)[len(loads) // 2]
    new_process = sorted(starts)[len(starts) // 2]
    out = {
        "model_mb": a.model_mb,
        "models": a.models,
        "process_mb": round(process_mb, 1),
        "worker_uss_mb": [round(u, 1) for u in worker_uss],
        "model_growth_mb": round(info.memory_mb, 1),
        "new_process_load_s": round(new_process, 3),
        "in_process_load_s": round(in_process, 3),
        "crash_models_lost_per_model": 1,
        "crash_survivors_per_model": survivors,
        "crash_models_lost_shared": a.models,
        "crash_reload_s_shared": round(a.models * in_process, 3),
        "fit_80gb": {f"context_{c}": {f"{s}mb": fits(UNIT_MIB, c, s) for s in SIZES_MB} for c in CONTEXTS_MIB},
    }
    print(
        f"per-process overhead {out['process_mb']} MB (torch imported, no model); "
        f"miss in a new process {new_process:.2f}s vs in a running one {in_process:.3f}s "
        f"for a {a.model_mb:.0f} MB model; a crash: {survivors}/{a.models - 1} others kept serving"
    )
    for c in CONTEXTS_MIB:
        row = ", ".join(
            f"{s} MB: {f['process_per_model']} ({f['process_per_model_mps']} with MPS) vs {f['shared']}"
            for s in SIZES_MB
            for f in [fits(UNIT_MIB, c, s)]
        )
        print(f"80 GB unit, context {c} MiB — process per model vs shared: {row}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
