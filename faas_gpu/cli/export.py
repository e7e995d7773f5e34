"""`faas-gpu export`: save a model the way python3-gpu loads it, from the script that defines it.

    faas-gpu export --model net.py:make --input-shape 3,32,32 -o function/model.pt2

MODULE:FACTORY as `faas-gpu profile` takes it (a path/to/file.py or a dotted module, and a
function returning the torch.nn.Module, weights loaded). The model is written as a torch.export
program with a dynamic batch dimension (`faas_gpu.saving.save_model`), checked with the GPU
Managers' rules, and the batch it accepts is said as the scheduler reads it ("batch: dynamic
1..4096"); the handler loads it with `torch.export.load(path).module()` and needs none of
the script's classes. A script can call `faas_gpu.save_model(model, example, path)` itself:
this command is the same for a model whose code should stay out of the handler.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import CliError


def cmd_export(args: argparse.Namespace) -> int:
    from faas_gpu.profiling.cli import UsageError, load_model, parse_shape
    from faas_gpu.profiling.operators import input_maker
    from faas_gpu.saving import NotConvertible, check_sendable, save_model

    try:
        shape = parse_shape(args.input_shape, "--input-shape")
        module = load_model(args.model)
    except UsageError as exc:
        raise CliError(f"export: {exc}") from None
    try:
        out = save_model(module, input_maker(shape, args.input_dtype)(1), args.output)
    except NotConvertible as exc:
        raise CliError(f"export: {str(exc).removeprefix('faas-gpu: ')}") from None
    except OSError as exc:
        raise CliError(f"export: cannot write {args.output}: {exc.strerror or exc}") from None
    batch = check_sendable(out.read_bytes(), str(out)).text()  # as the scheduler will read it
    print(f"wrote {out} (torch.export, batch: {batch}); in the handler: torch.export.load(path).module()")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from faas_gpu.profiling.operators import DTYPES

    p = sub.add_parser(
        "export",
        help="save a model as a torch.export program the GPU path loads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY", help="path/to/file.py or module, and factory")
    p.add_argument("--input-shape", required=True, metavar="C,H,W", help="one input without the batch dimension")
    p.add_argument("--input-dtype", default="float32", choices=DTYPES, help="int64 for token ids (default float32)")
    p.add_argument("-o", "--output", type=Path, default=Path("model.pt2"), help="default %(default)s")
    p.set_defaults(func=cmd_export)
