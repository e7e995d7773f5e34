"""CPU of small torch calls made from many request threads at once, against one thread (issue 20).

A torch call releases the GIL while it runs; in a process whose request threads wait for the GIL
(the instance's handler threads, up to one per caller), each release is a likely hand-over to
another thread: a futex wake, a context switch, and the releasing thread's wait to take it back.
This measures what that costs, in one run on this machine, for two versions of the classify
example's post-processing of one image's logits (the top class and its softmax score):

- `torch`: softmax, max and two tolist calls (the handler before issue 20's session 30);
- `python`: one tolist, then plain Python over the ten numbers (the handler now);

each run by 1, 8 and 32 threads at once, CPU (user + system) per call from `os.times`.

    .venv/bin/python benchmarks/thread_handover.py [--calls 20000]

Last line: one JSON object {torch_us: {threads: us}, python_us: {...}, torch_32_vs_1, python_vs_torch_32}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading

import torch

LOGITS = torch.randn(1, 10, generator=torch.Generator().manual_seed(0))


def with_torch() -> list[tuple[int, float]]:
    probs = torch.softmax(LOGITS, dim=1)
    scores, classes = probs.max(dim=1)
    return [(c, round(s, 6)) for c, s in zip(classes.tolist(), scores.tolist(), strict=True)]


def with_python() -> list[tuple[int, float]]:
    out = []
    for row in LOGITS.tolist():
        top = max(range(len(row)), key=row.__getitem__)
        out.append((top, round(1.0 / sum(math.exp(v - row[top]) for v in row), 6)))
    return out


def cpu_us_per_call(fn, threads: int, calls: int) -> float:
    def work(n: int) -> None:
        for _ in range(n):
            fn()

    t0 = os.times()
    pool = [threading.Thread(target=work, args=(calls // threads,)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    t1 = os.times()
    return (t1.user + t1.system - t0.user - t0.system) / (calls // threads * threads) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    assert with_torch() == with_python(), (with_torch(), with_python())  # the same answer
    out: dict = {"torch_us": {}, "python_us": {}}
    for threads in (1, 8, 32):
        out["torch_us"][threads] = round(cpu_us_per_call(with_torch, threads, a.calls), 1)
        out["python_us"][threads] = round(cpu_us_per_call(with_python, threads, a.calls), 1)
        t, p = out["torch_us"][threads], out["python_us"][threads]
        print(f"{threads:>2} threads: torch {t} us a call, python {p} us")
    out["torch_32_vs_1"] = round(out["torch_us"][32] / out["torch_us"][1], 2)
    out["python_vs_torch_32"] = round(out["python_us"][32] / out["torch_us"][32], 3)
    print(f"torch at 32 threads / at 1: x{out['torch_32_vs_1']}")
    print(f"python / torch at 32 threads: {out['python_vs_torch_32']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
