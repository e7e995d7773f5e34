"""`faas-gpu profile`: profile a model's operators (and the whole model) into the profile store.

    faas-gpu profile --model MODULE:FACTORY --input-shape 3,32,32 --name resnet-mini
    faas-gpu profile -f stack.yml [FUNCTION ...]
    faas-gpu profile --path FUNCTION [--gateway URL]

`--path FUNCTION` measures the serving path itself on a running stack (faas_gpu.profiling.path):
a copy of the deployed FUNCTION (its handler calls a profiled model) is driven at saturation with
the client's batching pinned at 1 and at --path-batch; what each batch took beyond the model's
own time is fitted as a fixed cost per batch + a cost per request and stored for this node, where
INFless's autoscaler adds it to the model's time.

Each configuration is timed --repeat times; one whose repeats spread more than --max-spread
(interquartile range over the median) is timed again (--retries). When the machine stays too
busy to trust (spread, or a prediction off by more than 2x), the output says so and what to do;
such a profile is stored only when the model has no clean one (marked noisy, and `faas-gpu up`
profiles it again), else the clean one is kept and the exit status is 1.

MODULE is a dotted module or a path/to/file.py; FACTORY() returns the torch.nn.Module. With a
stack file, every function (or those named) whose annotations have com.faas-gpu.model-source
("file.py:Factory", relative to the function's handler folder) and com.faas-gpu.input-shape is
profiled under the name in com.faas-gpu.model (default: the function's name), the name the
provider's autoscaler looks up. Bad input is one line naming the flag or annotation, exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import shlex
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from faas_gpu.contract import annotations as annotation_keys
from faas_gpu.stack import StackError, find_stack_file, load_stack

from .graph import TraceError
from .operators import DEFAULT_BATCHES, DTYPES, default_threads, devices, profile_model
from .report import DEFAULT_MAX_SPREAD
from .store import ProfileStore, profiles_db

MODEL_ANNOTATION = annotation_keys.MODEL
SOURCE_ANNOTATION = annotation_keys.MODEL_SOURCE
SHAPE_ANNOTATION = annotation_keys.INPUT_SHAPE
DTYPE_ANNOTATION = annotation_keys.INPUT_DTYPE


class UsageError(ValueError):
    """Bad input: printed as one line, exit status 2."""


class ProfilingFailed(RuntimeError):
    """The model ran out of something while being measured: one line, exit status 1."""


@dataclass(frozen=True)
class Job:
    """One model to profile, and how to name its flags or annotations in errors."""

    name: str
    source: str
    base: Path | None  # folder a file source is relative to
    shape: tuple[int, ...]
    dtype: str
    source_key: str  # "--model" or "functions.f.annotations.com.faas-gpu.model-source"
    shape_key: str
    rerun: str = "faas-gpu profile"  # the command that profiles this model again


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile",
        help="profile a model's operators for INFless's latency predictor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("functions", nargs="*", metavar="FUNCTION", help="with -f: only these functions")
    p.add_argument("-f", "--yaml", metavar="STACK", help="stack file (default ./stack.yaml or ./stack.yml)")
    p.add_argument("--model", metavar="MODULE:FACTORY", help="a dotted module or path/to/file.py, and its factory")
    p.add_argument("--input-shape", metavar="C,H,W", help="one input without the batch dimension, e.g. 3,32,32")
    p.add_argument("--input-dtype", default="float32", choices=DTYPES, help="int64 for token ids (default float32)")
    p.add_argument("--name", help="the model's name, as com.faas-gpu.model annotations give it")
    p.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="default %(default)s")
    p.add_argument("--threads", help=f"CPU threads (default {','.join(map(str, default_threads()))})")
    p.add_argument("--repeat", type=int, default=10, help="timed runs per configuration, median kept (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--remeasure", action="store_true", help="time operators already in the store again")
    p.add_argument(
        "--max-spread",
        type=float,
        default=DEFAULT_MAX_SPREAD,
        help="most spread of a configuration's repeats, IQR/median, before it counts as noisy (default %(default)s)",
    )
    p.add_argument("--retries", type=int, default=2, help="times a noisy configuration is timed again (default 2)")
    p.add_argument("--store", type=Path, help=f"profile database (default {profiles_db()})")
    p.add_argument("--path", metavar="FUNCTION", help="measure the serving path's cost with this deployed function")
    p.add_argument("--gateway", default="http://127.0.0.1:8080", help="with --path (default %(default)s)")
    p.add_argument("--path-batch", type=int, default=8, help="with --path: the batched point (default 8)")
    p.add_argument("--path-seconds", type=float, default=5.0, help="with --path: seconds a point (default 5)")
    p.add_argument("--path-body", default='{"seed": 1}', help="with --path: the request body (JSON)")
    p.set_defaults(func=run)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faas-gpu")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["profile", *(sys.argv[1:] if argv is None else argv)]))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "path", None):
        return run_path(args)
    try:
        batches = _ints(args.batches, "--batches")
        threads = _ints(args.threads, "--threads") if args.threads else default_threads()
        if args.repeat < 1:
            raise UsageError(f"--repeat: must be >= 1, got {args.repeat}")
        if args.warmup < 0:
            raise UsageError(f"--warmup: must be >= 0, got {args.warmup}")
        if not args.max_spread > 0:
            raise UsageError(f"--max-spread: must be > 0 (a fraction, 0.3 = 30%), got {args.max_spread}")
        if args.retries < 0:
            raise UsageError(f"--retries: must be >= 0, got {args.retries}")
        loaded = [(job, load_model(job.source, job.base, job.source_key)) for job in _jobs(args)]
        store = ProfileStore(args.store or profiles_db())
        for job, module in loaded:
            _profile(store, job, module, batches, threads, args)
    except (UsageError, StackError) as exc:
        print(f"faas-gpu profile: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error, ProfilingFailed) as exc:
        print(f"faas-gpu profile: {exc}", file=sys.stderr)
        return 1
    return 0


def _profile(
    store: ProfileStore, job: Job, module: Any, batches: list[int], threads: list[int], args: argparse.Namespace
) -> None:
    shape = ",".join(map(str, job.shape))
    bar = ProgressBar(job.name, len(batches) * len(threads) * len(devices()))
    try:
        res = profile_model(
            store,
            job.name,
            module,
            job.shape,
            batches=batches,
            threads=threads,
            repeat=args.repeat,
            warmup=args.warmup,
            dtype=job.dtype,
            remeasure=args.remeasure,
            progress=bar.step,
            max_spread=args.max_spread,
            retries=args.retries,
            rerun=job.rerun,
        )
    except TraceError as exc:
        raise UsageError(f"{job.source_key} {job.source!r} with {job.shape_key} {shape}: {exc}") from None
    except RuntimeError as exc:  # e.g. out of memory at a large batch: the grid, not the input, is at fault
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ProfilingFailed(f"profiling {job.name} failed: {type(exc).__name__}: {first}") from None
    finally:
        bar.close()
    print(
        f"{job.name}: {len(res.graph.nodes)} operators, {len(res.graph.signatures)} signatures; operators timed "
        f"at {res.measured_op_configs} configurations, taken from the store at {res.reused_op_configs}"
    )
    print("predicted (operators combined, before the predictor's 10% offset) vs measured end to end:")
    print(res.report.table())
    if not res.noisy:
        print(f"stored in {store.path}")
        return
    print(f"WARNING: {res.verdict}", file=sys.stderr)
    if not res.stored:
        raise ProfilingFailed(f"{job.name}: not stored; the clean profile already in {store.path} is kept")
    print(
        f"stored in {store.path}, marked noisy (the autoscaler needs a profile and had none; "
        f"`faas-gpu up` profiles it again)",
        file=sys.stderr,
    )


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise UsageError(f"{flag}: expected comma-separated integers >= 1 like 1,2,4, got {text!r}")
    return out


def parse_shape(text: str | None, key: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in (text or "").split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise UsageError(f"{key}: expected one input's shape without the batch, like 3,32,32 or 256, got {text!r}")
    return shape


def _jobs(args: argparse.Namespace) -> list[Job]:
    if args.model is not None:
        if args.yaml or args.functions:
            raise UsageError("--model profiles one model: leave out -f and FUNCTION names")
        if not args.input_shape:
            raise UsageError("--input-shape is required with --model (one input without the batch, e.g. 3,32,32)")
        if not args.name:
            raise UsageError("--name is required with --model (the name com.faas-gpu.model annotations use)")
        shape = parse_shape(args.input_shape, "--input-shape")
        rerun = "faas-gpu profile " + shlex.join(
            ["--model", args.model, "--input-shape", args.input_shape, "--name", args.name]
        )
        return [Job(args.name, args.model, None, shape, args.input_dtype, "--model", "--input-shape", rerun)]
    path = find_stack_file(args.yaml)
    if path is None:
        raise UsageError("give --model MODULE:FACTORY with --input-shape and --name, or -f stack.yml")
    stack = load_stack(path)
    names = args.functions or None
    specs = [s for n in names for s in stack.select(n)] if names else stack.select()
    jobs = []
    for fn in specs:
        ann = fn.annotations
        where = f"{path.name}: functions.{fn.name}.annotations"
        if SOURCE_ANNOTATION not in ann:
            if names:
                raise UsageError(f'{where}: {SOURCE_ANNOTATION} is required to profile {fn.name} ("model.py:Factory")')
            print(f"skipping {fn.name}: no {SOURCE_ANNOTATION} annotation", file=sys.stderr)
            continue
        if SHAPE_ANNOTATION not in ann:
            raise UsageError(f'{where}.{SHAPE_ANNOTATION}: is required with {SOURCE_ANNOTATION} (e.g. "3,32,32")')
        dtype = ann.get(DTYPE_ANNOTATION, "float32")
        if dtype not in DTYPES:
            raise UsageError(f"{where}.{DTYPE_ANNOTATION}: must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if not fn.handler:
            raise UsageError(f"{path.name}: functions.{fn.name}.handler: is required to find {SOURCE_ANNOTATION}")
        jobs.append(
            Job(
                ann.get(MODEL_ANNOTATION) or fn.name,
                ann[SOURCE_ANNOTATION],
                (fn.stack_dir / fn.handler).resolve(),
                parse_shape(ann[SHAPE_ANNOTATION], f"{where}.{SHAPE_ANNOTATION}"),
                dtype,
                f"{where}.{SOURCE_ANNOTATION}",
                f"{where}.{SHAPE_ANNOTATION}",
                "faas-gpu profile " + shlex.join(["-f", str(path), fn.name]),
            )
        )
    if not jobs:
        raise UsageError(f'{path.name}: no function has the annotation {SOURCE_ANNOTATION} ("model.py:Factory")')
    return jobs


# -- loading the model ---------------------------------------------------------------------------
@contextmanager
def _on_path(folder: Path) -> Iterator[None]:
    """`folder` first on sys.path while the user's module imports, so its sibling imports resolve."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


def _import(source: str, base: Path | None, key: str) -> Any:
    if source.endswith(".py") or "/" in source:
        path = (base / source) if base else Path(source)
        if not path.is_file():
            raise UsageError(f"{key}: no such file {path}")
        path = path.resolve()
        name = f"_faas_gpu_profiled_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{key}: cannot load {path} as a Python module")
        mod = importlib.util.module_from_spec(spec)
        with _on_path(path.parent):
            spec.loader.exec_module(mod)
        return mod
    if base is not None:
        with _on_path(base):
            return importlib.import_module(source)
    with _on_path(Path.cwd()):  # as `python -m` would find it
        return importlib.import_module(source)


def load_model(spec: str, base: Path | None = None, key: str = "--model") -> Any:
    """FACTORY() of `MODULE:FACTORY`; UsageError naming `key` for anything that is not an nn.Module."""
    from torch import nn

    module_part, sep, factory = spec.rpartition(":")
    if not sep or not module_part or not factory.isidentifier():
        raise UsageError(
            f"{key}: expected MODULE:FACTORY (a dotted module or path/to/file.py, and a function returning "
            f"a torch.nn.Module), got {spec!r}"
        )
    try:
        mod = _import(module_part, base, key)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module: any failure is a bad --model
        raise UsageError(f"{key}: cannot import {module_part}: {type(exc).__name__}: {exc}") from None
    make: Callable[[], Any] | None = getattr(mod, factory, None)
    if make is None:
        raise UsageError(f"{key}: {module_part} has no {factory!r}")
    if not callable(make):
        raise UsageError(f"{key}: {module_part}.{factory} is not callable")
    try:
        model = make()
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"{key}: {spec}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"{key}: {spec}() returned {type(model).__name__}, not a torch.nn.Module")
    return model


if __name__ == "__main__":
    sys.exit(main())


class ProgressBar:
    """The profiler's progress: a bar on a terminal, nothing in a log (tqdm's `disable=None`);
    a configuration measured again because the machine was noisy is said either way."""

    def __init__(self, name: str, total: int):
        self._bar = tqdm(
            total=total, desc=name, unit="config", disable=None, file=sys.stderr, leave=False, mininterval=0
        )

    def step(self, message: str) -> None:
        if message.endswith(", again"):
            self._bar.write(f"  {message}", file=sys.stderr)
        else:
            self._bar.update(1)
            self._bar.set_postfix_str(message.partition(": ")[2], refresh=False)

    def close(self) -> None:
        self._bar.close()


def run_path(args: argparse.Namespace) -> int:
    """`--path FUNCTION`: the path's fixed + per-request cost on this node, into the store."""
    import socket

    import requests

    from faas_gpu import paths

    from . import path as path_profile
    from .predictor import LatencyPredictor

    if args.path_batch < 2:
        print(f"faas-gpu profile: --path-batch: must be >= 2, got {args.path_batch}", file=sys.stderr)
        return 2
    gateway = args.gateway.rstrip("/")
    secrets = paths.secrets_dir(paths.home())
    try:
        auth = (
            (secrets / "basic-auth-user").read_text().strip(),
            (secrets / "basic-auth-password").read_text().strip(),
        )
    except OSError:
        auth = None
    store = ProfileStore(args.store or profiles_db())
    try:
        r = requests.get(f"{gateway}/system/function/{args.path}", auth=auth, timeout=10)
        model = args.name or ((r.json().get("annotations") or {}).get(MODEL_ANNOTATION) if r.ok else None)
        if not model:
            print(
                f"faas-gpu profile: --path: function {args.path!r} names no model ({MODEL_ANNOTATION})", file=sys.stderr
            )
            return 2
        model_ms = _model_ms(LatencyPredictor(store, prefer_measured=True), model)  # as the planner predicts it
        print(f"path cost of {args.path} ({model}) through {gateway}:")
        cost, points = path_profile.measure(
            gateway,
            auth,
            args.path,
            model_ms,
            batches=(1, args.path_batch),
            body=args.path_body.encode(),
            seconds=args.path_seconds,
        )
    except (OSError, LookupError, RuntimeError, requests.RequestException) as exc:
        print(f"faas-gpu profile: --path: {exc}", file=sys.stderr)
        return 1
    node = socket.gethostname()
    store.put_path_cost(node, cost.fixed_s * 1000, cost.per_item_s * 1000, path_profile.points_json(points))
    print(f"stored for node {node}: {cost.fixed_s * 1000:.2f} ms a batch + {cost.per_item_s * 1000:.2f} ms a request")
    return 0


def _model_ms(predictor: Any, model: str) -> Callable[[int], float]:
    """The model's predicted ms at any batch size (1 CPU thread), interpolated between profiled ones."""
    known = sorted((b, ms) for b, c, g, ms in predictor.configs(model) if c == 1 and g == 0)
    if not known:
        raise LookupError(f"model {model!r} has no 1-thread CPU profile: run `faas-gpu profile` for it first")

    def at(batch: int) -> float:
        lower = [p for p in known if p[0] <= batch] or known[:1]
        upper = [p for p in known if p[0] >= batch] or known[-1:]
        (b0, m0), (b1, m1) = lower[-1], upper[0]
        if b1 == b0:
            return m0 * batch / b0
        return m0 + (m1 - m0) * (batch - b0) / (b1 - b0)

    return at
