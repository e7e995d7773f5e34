"""`faas-gpu fit`: HarmonyBatch's latency coefficients of a torch model, fitted on this node.

    faas-gpu fit --model MODULE:FACTORY --input-shape 3,32,32 --name resnet-mini --threads 1,2,4 \\
        --gpu-from model.json:VGG19

Times the model at each thread count (standing in for vCPU) for batches 1..4, fits Eq. 1's
average and maximum curves per batch (`faas_gpu.policies.harmony.fitter`, which refuses negative
or non-monotone coefficients and says which), and writes the model's entry into a coefficients
file in HarmonyBatch's `model.json` format (default: the provider's `harmony-models.json`). The
GPU block (Eq. 2-4) is measured on a GPU: `--gpu-from FILE:MODEL` copies it from such a file; the
planner needs both. Bad input is one line naming the flag, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from faas_gpu import paths

from .cli import UsageError, _ints, load_model, parse_shape

MIN_THREAD_COUNTS = 3  # Eq. 1 has three coefficients per curve


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "fit",
        help="fit HarmonyBatch's CPU latency coefficients of a model on this node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY")
    p.add_argument("--input-shape", required=True, metavar="C,H,W")
    p.add_argument("--name", required=True, help="the entry's name (com.faas-gpu.harmony-model)")
    p.add_argument("--threads", default="1,2,4", help="thread counts standing in for vCPU (default 1,2,4)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--gpu-from", metavar="FILE:MODEL", help="the GPU block of MODEL in FILE (model.json format)")
    p.add_argument("--out", type=Path, help="coefficients file (default <home>/harmony-models.json)")
    p.set_defaults(func=run)
    return p


def _gpu_block(spec: str | None) -> dict:
    if not spec:
        raise UsageError("--gpu-from: the planner needs GPU coefficients (Eq. 2-4), measured on a GPU: FILE:MODEL")
    file, sep, model = spec.rpartition(":")
    if not sep or not file or not model:
        raise UsageError(f"--gpu-from: expected FILE:MODEL, got {spec!r}")
    try:
        entry = json.loads(Path(file).read_text())[model]
        return entry["GPU"]
    except (OSError, ValueError) as exc:
        raise UsageError(f"--gpu-from: cannot read {file}: {exc}") from None
    except (KeyError, TypeError):
        raise UsageError(f"--gpu-from: {file} has no GPU block for {model!r}") from None


def run(args: argparse.Namespace) -> int:
    from faas_gpu.policies.harmony.fitter import CoefficientError, fit_cpu
    from faas_gpu.policies.harmony.models import ModelCoefficients
    from faas_gpu.profiling.harmony_runs import profile_cpu

    try:
        threads = _ints(args.threads, "--threads")
        if len(set(threads)) < MIN_THREAD_COUNTS:
            raise UsageError(f"--threads: Eq. 1 needs at least {MIN_THREAD_COUNTS} thread counts, got {args.threads}")
        if args.repeat < 2:
            raise UsageError(f"--repeat: at least 2 runs give a maximum and an average, got {args.repeat}")
        shape = parse_shape(args.input_shape, "--input-shape")
        gpu = _gpu_block(args.gpu_from)
        module = load_model(args.model)
    except UsageError as exc:
        print(f"faas-gpu fit: {exc}", file=sys.stderr)
        return 2
    import torch

    module.eval()
    samples = profile_cpu(
        module, lambda b: torch.randn(b, *shape), sorted(set(threads)), time.perf_counter, repeats=args.repeat
    )
    try:
        cpu = fit_cpu(samples)
    except (CoefficientError, ValueError) as exc:
        print(f"faas-gpu fit: the runs on this node do not fit Eq. 1: {exc}", file=sys.stderr)
        return 1
    entry = {
        "CPU": {
            "mem": [cpu.mem_mb_per_batch, cpu.mem_mb_fixed],
            "avg": {"Exponential": [[c.alpha, c.beta, c.gamma] for c in cpu.avg]},
            "max": {"Exponential": [[c.alpha, c.beta, c.gamma] for c in cpu.max]},
        },
        "GPU": gpu,
    }
    ModelCoefficients.from_json(args.name, entry)  # the provider must be able to read what we write
    out = args.out or paths.home() / "harmony-models.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data[args.name] = entry
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))

    def curve(c) -> str:
        return f"{c.alpha:.4g}*exp(-c/{c.beta:.4g})+{c.gamma:.4g}"

    for b, (a, m) in enumerate(zip(cpu.avg, cpu.max, strict=True), 1):
        print(f"batch {b}: avg {curve(a)}  max {curve(m)}")
    print(f"{args.name} written to {out}")
    return 0
