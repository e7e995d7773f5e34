"""INFless's combined operator profiling (§3.3, Fig. 8) on this machine's CPU: predicted vs measured.

Two models, profiled over threads 1..cpu_count and batches 1..32 into a fresh store:
ResNetMini (functions/classify, chains with residual joins) and TextCNN
(faas_gpu/profiling/examples.py, three parallel convolution branches). For every configuration
it prints the prediction from the combined operator profiles (P^, without the 10% offset, as
the paper's figure), the model measured end to end (P) and |P^ - P| / P. The paper reports
< 10% on average (ResNet-50 8.6%, MobileNet 7.8%, LSTM-2365 9.74%).

In the same run, against the same measurements:
- baseline: the batch-1 latency x batch (a profile of batch 1 only, scaled linearly). Its
  batch-1 rows are its own reference (error 0), which favours it;
- the paper's max-over-branches rule: eager PyTorch runs one operator at a time, so the traced
  graphs combine as the sum of their operators; the longest-path rule is shown for comparison;
- shared operators: a deeper ResNetMini (two more 64-channel blocks), whose operators are all
  in the store already, is predicted without timing any operator and then measured.

Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from faas_gpu.profiling import LatencyPredictor, ProfileStore, error_report  # noqa: E402
from faas_gpu.profiling.examples import SEQ_LEN, textcnn  # noqa: E402
from faas_gpu.profiling.operators import profile_model  # noqa: E402
from functions.classify.model import BasicBlock, ResNetMini  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32)
PAPER_PCT = {"resnet-50": 8.6, "mobilenet": 7.8, "lstm-2365": 9.74}
OFFSET = 0.10


def resnet_mini():
    return ResNetMini().eval()


def resnet_mini_deep():
    """ResNetMini with two more BasicBlock(64, 64): every operator is one ResNetMini already has."""
    m = ResNetMini()
    m.layers.append(BasicBlock(64, 64))
    m.layers.append(BasicBlock(64, 64))
    return m.eval()


MODELS = {  # name -> (factory, input shape, dtype)
    "resnet-mini": (resnet_mini, (3, 32, 32), "float32"),
    "textcnn": (textcnn, (SEQ_LEN,), "int64"),
}


def key(name: str) -> str:
    return name.replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=30, help="timed runs per configuration (median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", help="comma-separated (default 1..cpu_count)")
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(range(1, (os.cpu_count() or 1) + 1))
    started = time.monotonic()
    fig: dict[str, float | int | str] = {}
    baseline_errors: list[float] = []
    covered = total = 0

    with tempfile.TemporaryDirectory() as tmp:
        store = ProfileStore(Path(tmp) / "profiles.db")
        predictor = LatencyPredictor(store, offset=OFFSET)
        print(f"COP accuracy on this CPU: threads {threads}, batches {list(BATCHES)}, median of {args.repeat} runs")
        for name, (factory, shape, dtype) in MODELS.items():
            run = profile_model(
                store, name, factory(), shape, batches=BATCHES, threads=threads, repeat=args.repeat,
                warmup=args.warmup, dtype=dtype, on=["cpu"],
            )  # fmt: skip
            rep = error_report(store, name)
            max_rule = error_report(store, name, concurrent=True)
            batch1 = {r.threads: r.measured_ms for r in rep.rows if r.batch == 1}
            print(f"\n{name}: {len(run.graph.nodes)} operators ({len(run.graph.signatures)} signatures)")
            print(f"{'batch':>5} {'thr':>3} {'P^ ms':>9} {'P ms':>9} {'error':>7} {'base ms':>9} {'base err':>8}")
            for r in rep.rows:
                base = batch1[r.threads] * r.batch
                base_err = abs(base - r.measured_ms) / r.measured_ms
                baseline_errors.append(base_err)
                total += 1
                covered += predictor.predict_ms(name, r.batch, r.threads) >= r.measured_ms
                print(
                    f"{r.batch:>5} {r.threads:>3} {r.predicted_ms:>9.3f} {r.measured_ms:>9.3f} {r.error * 100:>6.1f}%"
                    f" {base:>9.3f} {base_err * 100:>7.1f}%"
                )
            print(
                f"{name}: mean error {rep.mean_error * 100:.1f}% (paper < 10%); "
                f"max-over-branches rule {max_rule.mean_error * 100:.1f}%"
            )
            fig[f"cop_mean_error_pct_{key(name)}"] = round(rep.mean_error * 100, 2)
            fig[f"cop_max_rule_error_pct_{key(name)}"] = round(max_rule.mean_error * 100, 2)

        deep = profile_model(
            store, "resnet-mini-deep", resnet_mini_deep(), (3, 32, 32), batches=BATCHES, threads=threads,
            repeat=args.repeat, warmup=args.warmup, on=["cpu"],
        )  # fmt: skip
        rep = error_report(store, "resnet-mini-deep")
        print("\n" + rep.table())
        print(
            f"resnet-mini-deep from shared operators: operators timed at {deep.measured_op_configs} of "
            f"{len(deep.configs)} configurations; mean error {rep.mean_error * 100:.1f}% "
            f"(max {max(r.error for r in rep.rows) * 100:.1f}%)"
        )
        fig["cop_shared_ops_error_pct_resnet_mini_deep"] = round(rep.mean_error * 100, 2)
        fig["shared_ops_configs_timed"] = deep.measured_op_configs
        store.close()

    cop = statistics.fmean(fig[f"cop_mean_error_pct_{key(n)}"] for n in MODELS)
    base = statistics.fmean(baseline_errors) * 100
    fig["cop_mean_error_pct"] = round(cop, 2)
    fig["baseline_mean_error_pct"] = round(base, 2)
    fig["baseline_to_cop_error_ratio"] = round(base / cop, 2) if cop else float("inf")
    fig["offset_covers_pct"] = round(100 * covered / total, 1)
    fig["configs"] = total
    fig["cpu_count"] = os.cpu_count() or 1
    fig["seconds"] = round(time.monotonic() - started, 1)
    print(
        f"\nmean error: COP {cop:.1f}% vs batch-1 x batch baseline {base:.1f}% "
        f"({fig['baseline_to_cop_error_ratio']}x); "
        f"prediction + {OFFSET:.0%} offset >= measured in {fig['offset_covers_pct']}% of configurations"
    )
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
