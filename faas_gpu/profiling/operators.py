"""Measuring operator profiles (INFless §3.3) and whole-model latencies on this machine.

Each operator of the traced graph is timed inside an `fx.Interpreter` (time.perf_counter around
the call only, under torch.inference_mode), `repeat` times after `warmup` runs; its profile is
the median. Operators with one signature (a layer used twice on the same shapes) share one mean.
The CPU threads of a configuration are torch's intra-op threads (`torch.set_num_threads`),
which stand in for the instance's CPU cores. The whole model is timed end to end, the same way,
in the same grid: the measured fallback of the predictor and the reference of the error report.
Medians keep a profile clear of transient interference, but medians do not add: under sustained
contention (more runnable threads than cores) the sum of operator medians falls below the
model's median, by 15-20% for ResNetMini at batch 8-32 at a load of 9 on 2 cores. Profile on
an idle node, as INFless does on cgroup-pinned cores.

Operators already in the store at a configuration are not measured again (unless `remeasure`):
a model built from profiled operators gets its prediction without running its operators.

GPU: when CUDA is available, every configuration is also measured on cuda at a share of 100%
(the whole GPU), synchronising around each timing. Shares below 100% need the model to run
under an MPS daemon with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set, which this process cannot
change for itself; those rows come from INFless's profile files or must be measured by a
profiler started under MPS, and none is derived from the 100% figure.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faas_gpu.contract.annotations import INPUT_DTYPES

from .graph import OPS, OpGraph, trace_model
from .store import Config, ProfileStore

DTYPES = INPUT_DTYPES  # what com.faas-gpu.input-dtype may name
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32)


def default_threads() -> list[int]:
    """1, 2, 4, ... up to this machine's cores, and the core count itself."""
    n = os.cpu_count() or 1
    out, t = [], 1
    while t < n:
        out.append(t)
        t *= 2
    return [*out, n]


def input_maker(shape: Sequence[int], dtype: str = "float32", device: str = "cpu") -> Callable[[int], Any]:
    """make(b) -> a batch of b inputs of `shape`; integer inputs (token ids) are zeros, valid for any vocabulary."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)

    def make(b: int) -> Any:
        if dt.is_floating_point:
            return torch.randn((b, *shape), generator=gen).to(device=device, dtype=dt)
        return torch.zeros((b, *shape), dtype=dt, device=device)

    return make


@dataclass
class ProfileRun:
    """What one `profile_model` call did."""

    model: str
    graph: OpGraph
    configs: list[tuple[int, int, str, int]] = field(default_factory=list)  # batch, threads, device, share
    measured_op_configs: int = 0  # configurations at which operators were timed
    reused_op_configs: int = 0  # configurations whose operators were all in the store already
    spreads: dict[Config, float] = field(default_factory=dict)  # of the repeats kept, (Q3 - Q1) / median
    report: Any = None  # report.ErrorReport of this run's measurements
    noisy: bool = False  # the machine was too busy (report.noise_verdict); only judged with max_spread
    verdict: str = ""  # what to tell the user when noisy
    stored: bool = True  # False: noisy, and the clean profile already stored was kept


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _callable(interp: Any, n: Any, args: tuple) -> tuple[Callable[..., Any], tuple]:
    """What a node calls, resolved before the clock starts (a submodule lookup is no part of the op)."""
    if n.op == "call_module":
        return interp.fetch_attr(n.target), args
    if n.op == "call_method":
        return getattr(args[0], n.target), args[1:]
    return n.target, args


def measure(
    gm: Any,
    module: Any,
    x: Any,
    repeat: int,
    warmup: int,
    device: str = "cpu",
    ops: bool = True,
    whole: bool = True,
    samples_out: dict[str, list[float]] | None = None,
) -> tuple[dict[str, float], float | None]:
    """Median ms of every operator node of `gm` (node name -> ms) and of the whole `module`, on input `x`.

    The two are timed in alternation, one run each per repetition, so that a change in the
    machine's load (other processes on shared cores) hits both alike. samples_out, when given,
    gets each repetition's ms: "whole" (the model) and "ops" (its operators summed).
    """
    import torch
    from torch import fx

    sync = _sync(device)
    samples: dict[str, list[float]] = {}
    whole_runs: list[float] = []

    class Timer(fx.Interpreter):
        record = False

        def run_node(self, n: Any) -> Any:
            if n.op not in OPS:
                return super().run_node(n)
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            fn, args = _callable(self, n, args)
            sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            dt = time.perf_counter() - t0
            if self.record:
                samples.setdefault(n.name, []).append(dt * 1000.0)
            return out

    timer = Timer(gm)
    with torch.inference_mode():
        for i in range(warmup + repeat):
            if ops:
                timer.record = i >= warmup
                timer.run(x)
            if whole:
                sync()
                t0 = time.perf_counter()
                module(x)
                sync()
                if i >= warmup:
                    whole_runs.append((time.perf_counter() - t0) * 1000.0)
    node_ms = {name: statistics.median(v) for name, v in samples.items()}
    if samples_out is not None:
        samples_out["whole"] = whole_runs
        samples_out["ops"] = [sum(run) for run in zip(*samples.values(), strict=True)] if samples else []
    return node_ms, (statistics.median(whole_runs) if whole_runs else None)


def by_signature(graph: OpGraph, node_ms: dict[str, float]) -> dict[str, float]:
    """Per-node times -> per-signature profiles (the mean over the nodes that share a signature)."""
    groups: dict[str, list[float]] = {}
    for n in graph.nodes:
        groups.setdefault(n.signature, []).append(node_ms[n.name])
    return {sig: statistics.fmean(v) for sig, v in groups.items()}


def devices() -> list[str]:
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def register_model(
    store: ProfileStore,
    name: str,
    module: Any,
    input_shape: Sequence[int],
    dtype: str = "float32",
    concurrent_branches: bool = False,
) -> OpGraph:
    """Trace a model and store its graph only: enough to predict it from operators already profiled."""
    module = module.eval()
    _, graph = trace_model(module, input_maker(input_shape, dtype), concurrent_branches)
    old = store.graph(name)
    if old is not None and old != graph:
        store.forget_model(name)
    store.put_graph(name, graph)
    return graph


def profile_model(
    store: ProfileStore,
    name: str,
    module: Any,
    input_shape: Sequence[int],
    *,
    batches: Iterable[int] = DEFAULT_BATCHES,
    threads: Iterable[int] | None = None,
    repeat: int = 10,
    warmup: int = 2,
    dtype: str = "float32",
    on: Sequence[str] | None = None,
    measure_model: bool = True,
    remeasure: bool = False,
    concurrent_branches: bool = False,
    progress: Callable[[str], None] | None = None,
    max_spread: float | None = None,
    retries: int = 2,
    rerun: str = "faas-gpu profile",
) -> ProfileRun:
    """Trace `module`, store its graph, and profile its operators (and the whole model) over the grid.

    on: devices to profile, default cpu and, when available, cuda (share 100).
    max_spread: judge the machine's noise (`report.noise_verdict`): a configuration whose repeats
    spread more is measured again, up to `retries` times, its quietest attempt kept. Noisy in the
    end, the run is stored only when the model has no clean profile yet (a deploy needs one),
    marked noisy; a clean profile already stored is kept instead (`run.stored` False). Every
    write waits for that decision. None: no judgement, everything stored (as before).
    """
    import torch

    from .report import noise_verdict, rows_report, spread

    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got repeat {repeat}, warmup {warmup}")
    batches = sorted({int(b) for b in batches})
    threads = sorted({int(t) for t in (threads or default_threads())})
    if not batches or batches[0] < 1 or not threads or threads[0] < 1:
        raise ValueError("batches and threads must be one or more integers >= 1")
    module = module.eval()
    gm, graph = trace_model(module, input_maker(input_shape, dtype), concurrent_branches)
    run = ProfileRun(name, graph)
    ops_out: dict[Config, dict[str, float]] = {}
    model_out: dict[Config, float] = {}
    before = torch.get_num_threads()
    try:
        for device in on or devices():
            share = 100 if device == "cuda" else 0
            mod, g = module.to(device), gm.to(device)
            make = input_maker(input_shape, dtype, device)
            for t in threads:
                torch.set_num_threads(t)
                for b in batches:
                    x = make(b)
                    config = (b, t, device, share)
                    have = store.ops_at(graph.signatures, b, t, device, share)
                    need_ops = remeasure or have.keys() != graph.signatures
                    if not (need_ops or measure_model):
                        run.reused_op_configs += 1
                        run.configs.append(config)
                        continue
                    best = None
                    for _ in range(1 + (retries if max_spread is not None else 0)):
                        samples: dict[str, list[float]] = {}
                        node_ms, whole_ms = measure(
                            g, mod, x, repeat, warmup, device, ops=need_ops, whole=measure_model, samples_out=samples
                        )
                        noise = max(spread(samples.get("whole", [])), spread(samples.get("ops", [])))
                        if best is None or noise < best[0]:
                            best = (noise, node_ms, whole_ms)
                        if max_spread is None or noise <= max_spread:
                            break
                        if progress:
                            progress(f"{name}: batch {b}, {t} threads, {device}: repeats spread {noise:.0%}, again")
                    noise, node_ms, whole_ms = best
                    run.spreads[config] = noise
                    if need_ops:
                        ops_out[config] = by_signature(graph, node_ms)
                        run.measured_op_configs += 1
                    else:
                        run.reused_op_configs += 1
                    if whole_ms is not None:
                        model_out[config] = whole_ms
                    run.configs.append(config)
                    if progress:
                        progress(f"{name}: batch {b}, {t} threads, {device}")
    finally:
        torch.set_num_threads(before)
        module.to("cpu")
    ops_all = {c: {**store.ops_at(graph.signatures, *c), **ops_out.get(c, {})} for c in model_out}
    run.report = rows_report(name, graph, ops_all, model_out, run.spreads)
    if max_spread is not None:
        verdict = noise_verdict(run.report, run.spreads, max_spread, rerun)
        run.noisy = verdict.noisy
        run.verdict = verdict.message
    old = store.graph(name)
    clean_before = old == graph and bool(store.model_profiles(name)) and store.noisy(name) is None
    if run.noisy and clean_before:
        run.stored = False  # the previous, clean profile stays
        return run
    if old is not None and old != graph:  # another model under this name: its measurements are not this one's
        store.forget_model(name)
    store.put_graph(name, graph)
    for (b, t, device, share), times in ops_out.items():
        store.put_ops(b, t, device, share, times)
    for (b, t, device, share), ms in model_out.items():
        store.put_model(name, b, t, device, share, ms)
    store.mark_noisy(name, run.verdict if run.noisy else None)
    return run
