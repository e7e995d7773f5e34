"""What batch a model accepts, read from its archive as data (issue 43).

Why: `torch.export.export(m, (x,))` with one example input gives a program whose batch is
static (1): it refuses any other, so the instance's batch queue, which stacks concurrent calls,
turned half of 32 concurrent calls into `400 … Expected input at *args[0].shape[0] to be equal
to 1, but got 3`. The batch a program accepts is in its `models/model.json`, never run:

- the first user input's tensor (`graph_module.signature.input_specs`, `user_input`) has its
  sizes in `graph_module.graph.tensor_values`: a first size `as_int` N is a **static** batch N;
- an `as_expr` that is one shape symbol (`Symbol('s77', …)`) is a **dynamic** batch, its range
  `range_constraints[symbol]` (`min_val`, `max_val`; a null `max_val` is unbounded). torch
  spells a dimension it would not specialise at 0/1 as min 2 (`Dim.AUTO`) yet runs batch 1: a
  minimum of 2 or less is read as 1;
- anything else (the first input not a tensor, a scalar, a size that is an expression of a
  symbol such as `2*s0`) is **unknown**, as is every TorchScript archive (its shapes are not
  declared anywhere it can be read without running it).

What the batch queues do with it (`max_rows`): a static batch, or an unknown one, runs each call
alone (calls are still admitted concurrently, never stacked); a dynamic range stacks calls up
to its maximum. The scheduler and the GPU Manager refuse (400, `BatchRefused`) a batch the
model would refuse, before anything is placed or run (`check_batch`). A malformed field is an
`ArtifactError` naming it (a 400 at upload), never a crash: the file comes from whoever uploads
it.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from faas_gpu.contract.errors import ArtifactError, BatchRefused

UNBOUNDED_FROM = 2**62  # a max_val this large is torch's infinity written as an integer
_MAX_INT = 2**63


@dataclass(frozen=True)
class BatchLimits:
    """kind: static, dynamic or unknown; `low`..`high` the batch sizes it accepts (high None:
    unbounded); for static, low == high == the batch."""

    kind: str
    low: int = 1
    high: int | None = None
    why: str = ""  # for unknown: why it could not be read

    @property
    def max_rows(self) -> int | None:
        """The most rows a batch queue may stack for it: 1 (each call alone) for a static or an
        unknown batch, the range's maximum for a dynamic one (None: no limit of the model's)."""
        if self.kind == "dynamic":
            return self.high
        return 1

    def text(self) -> str:
        """As the CLI and the upload answer say it: "static 1", "dynamic 1..64", "dynamic 1..",
        "unknown (TorchScript …)"."""
        if self.kind == "static":
            return f"static {self.low}"
        if self.kind == "dynamic":
            return f"dynamic {self.low}..{'' if self.high is None else self.high}"
        return f"unknown ({self.why}): calls run one at a time" if self.why else "unknown: calls run one at a time"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "min": self.low, "max": self.high, "text": self.text()}

    @classmethod
    def from_json(cls, d: Any) -> BatchLimits:
        """The upload answer's `batch`, read back (by the instance): anything malformed is unknown."""
        if not isinstance(d, dict) or d.get("kind") not in ("static", "dynamic", "unknown"):
            return UNKNOWN
        low, high = d.get("min"), d.get("max")
        if not _is_int(low) or low < 0 or (high is not None and (not _is_int(high) or high < low)):
            return UNKNOWN
        if d["kind"] == "static":
            return cls("static", low, low)
        if d["kind"] == "dynamic":
            return cls("dynamic", low, high)
        return UNKNOWN


UNKNOWN = BatchLimits("unknown", why="not read")
TORCHSCRIPT = BatchLimits("unknown", why="TorchScript declares no batch")


def tighter(limit: int, limits: BatchLimits | None) -> int:
    """`limit` (an instance's batch size) within what the model accepts."""
    if limits is None or limits.max_rows is None:
        return limit
    return max(1, min(limit, limits.max_rows))


def check_batch(limits: BatchLimits | None, shape: Sequence[int], model: str = "the model") -> None:
    """BatchRefused, naming the batch dimension and what `model` accepts, for a batch of `shape`
    its program would refuse; nothing for one it accepts or whose batch is unknown.

    Why here and not left to the model: the scheduler and the GPU Manager take batches from
    callers that need not have read the limits (a stale client, a hostile one with a function
    token, a leased batch sent straight to a manager), and the model's own refusal comes only
    after a placement and a load, worded by torch. The rule is torch's own input check (its
    `module()`'s pre-hook, which runs with the guards off too): a static batch N takes exactly N
    rows; a dynamic one at most its maximum, and at least its minimum where that is above 1 (a
    minimum read as 1 was torch's 0..2, which it does not enforce: an empty batch runs)."""
    if limits is None or limits.kind not in ("static", "dynamic"):
        return
    accepts = f"{model} accepts batch {limits.text()}"
    if len(shape) == 0:
        raise BatchRefused(f"shape: a scalar has no batch dimension (shape[0]); {accepts}")
    rows = shape[0]
    if limits.kind == "static":
        refused = rows != limits.low
    else:
        refused = (limits.high is not None and rows > limits.high) or (limits.low > 1 and rows < limits.low)
    if refused:
        raise BatchRefused(f"shape[0]: a batch of {rows} rows; {accepts}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) < _MAX_INT


def _field(where: str, why: str) -> ArtifactError:
    return ArtifactError(f"artifact: models/model.json: {where} {why}")


def _get(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict):
        raise _field(where, "is not an object")
    if key not in d:
        raise _field(f"{where}.{key}", "is missing")
    return d[key]


def of_program(program: Any) -> BatchLimits:
    """The batch a torch.export program's JSON (`models/model.json`) declares; ArtifactError
    naming the field for a malformed one."""
    gm = _get(program, "graph_module", "(top)")
    specs = _get(_get(gm, "signature", "graph_module"), "input_specs", "graph_module.signature")
    if not isinstance(specs, list):
        raise _field("graph_module.signature.input_specs", "is not a list")
    first = next((s for s in specs if isinstance(s, dict) and "user_input" in s), None)
    if first is None:
        return BatchLimits("unknown", why="the program takes no input")
    arg = _get(_get(first, "user_input", "input_specs[]"), "arg", "input_specs[].user_input")
    if not isinstance(arg, dict) or "as_tensor" not in arg:
        return BatchLimits("unknown", why="its first input is not a tensor")
    name = _get(arg["as_tensor"], "name", "input_specs[].user_input.arg.as_tensor")
    if not isinstance(name, str):
        raise _field("input_specs[].user_input.arg.as_tensor.name", "is not a string")
    values = _get(_get(gm, "graph", "graph_module"), "tensor_values", "graph_module.graph")
    where = f"graph_module.graph.tensor_values[{name[:80]!r}]"
    sizes = _get(values, name, "graph_module.graph.tensor_values")
    sizes = _get(sizes, "sizes", where)
    if not isinstance(sizes, list):
        raise _field(f"{where}.sizes", "is not a list")
    if not sizes:
        return BatchLimits("unknown", why="its first input is a scalar")
    first_size = sizes[0]
    where = f"{where}.sizes[0]"
    if not isinstance(first_size, dict) or len(first_size) != 1:
        raise _field(where, "is not one of as_int or as_expr")
    if "as_int" in first_size:
        n = first_size["as_int"]
        if not _is_int(n) or n < 1:
            raise _field(f"{where}.as_int", f"is not a batch size (a positive integer): {str(n)[:40]!r}")
        return BatchLimits("static", n, n)
    if "as_expr" not in first_size:
        raise _field(where, "is not one of as_int or as_expr")
    expr = _get(first_size["as_expr"], "expr_str", f"{where}.as_expr")
    symbol = _symbol(expr, f"{where}.as_expr.expr_str")
    if symbol is None:
        return BatchLimits("unknown", why="its batch size is an expression of a shape symbol")
    ranges = _get(program, "range_constraints", "(top)")
    where = f"range_constraints[{symbol!r}]"
    bounds = _get(ranges, symbol, "range_constraints")
    low, high = _get(bounds, "min_val", where), _get(bounds, "max_val", where)
    if not _is_int(low) or low < 0:
        raise _field(f"{where}.min_val", f"is not a non-negative integer: {str(low)[:40]!r}")
    if high is not None and (not _is_int(high) or high < max(low, 1)):
        raise _field(f"{where}.max_val", f"is not null or an integer at least min_val: {str(high)[:40]!r}")
    if high is not None and high >= UNBOUNDED_FROM:
        high = None
    return BatchLimits("dynamic", 1 if low <= 2 else low, high)


def _symbol(expr: Any, where: str) -> str | None:
    """The symbol's name when `expr` is one symbol (`Symbol('s77', positive=True, integer=True)`
    or `s77`), None for another expression. Parsed, never evaluated."""
    if not isinstance(expr, str) or len(expr) > 10_000:
        raise _field(where, "is not a short string")
    try:
        node = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # MemoryError: nested past the parser's stack
        raise _field(where, f"does not parse: {expr[:80]!r}") from None
    if isinstance(node, ast.Name):
        return node.id
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Symbol"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None
