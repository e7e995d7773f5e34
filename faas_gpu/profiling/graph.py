"""A model's operator graph (INFless §3.3): operator signatures and data dependencies, and the
combination of per-operator times into a model latency.

The graph comes from `torch.fx.symbolic_trace`, or from `torch.export` (batch dimension left
dynamic) for models that symbolic tracing cannot follow. Its nodes are the call_module,
call_function and call_method nodes; an edge p -> n means n reads p's output.

An operator's *signature* is what its execution time depends on apart from the batch size and
the resources: the op type (with a module's configuration), the shapes of its tensor inputs
without the batch dimension, and its non-tensor arguments. Two models that use the same layer
on the same shapes share the signature, hence the profile. The batch dimension is found by
running the model at two batch sizes and marking the dimensions that change (`*`), so it need
not be dimension 0 (a sequence-first LSTM, a flattened batch x time).

Combination (§3.3): a sequence chain costs the sum of its operators and parallel branches the
maximum of the branches, which for a general DAG is its longest path with operators as node
weights. That holds for an executor that runs independent operators at the same time
(TensorFlow's inter-op pool, in the paper). Eager PyTorch runs one operator at a time on one
stream, so a fork/join there costs the sum of its branches: a traced graph is marked
`concurrent_branches=False` and combines as the sum of all its operators, unless the caller
says its executor overlaps branches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

GRAPH_FORMAT = 1
OPS = ("call_module", "call_function", "call_method")
PROBE_BATCHES = (2, 3)  # two batch sizes: the dimensions that differ are the batch dimensions


class TraceError(ValueError):
    """The model could not be turned into an operator graph (message says why)."""


@dataclass(frozen=True)
class OpNode:
    name: str
    op: str  # short operator name, e.g. "Conv2d", "add", "aten.convolution.default"
    signature: str
    inputs: tuple[str, ...] = ()


@dataclass
class OpGraph:
    """Operators in topological order; `inputs` name the operators each one reads."""

    nodes: list[OpNode]
    concurrent_branches: bool = False
    _by_name: dict[str, OpNode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name = {}
        for n in self.nodes:
            if n.name in self._by_name:
                raise ValueError(f"operator graph: duplicate node {n.name!r}")
            for p in n.inputs:
                if p not in self._by_name:
                    raise ValueError(f"operator graph: {n.name!r} reads {p!r}, which is not an earlier node")
            self._by_name[n.name] = n

    @property
    def signatures(self) -> set[str]:
        return {n.signature for n in self.nodes}

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(p, n.name) for n in self.nodes for p in n.inputs]

    def combine(self, time_of: Mapping[str, float] | Callable[[str], float], concurrent: bool | None = None) -> float:
        """The model's latency from its operators' times (keyed by signature).

        concurrent (default: the graph's own `concurrent_branches`): True takes the longest path,
        so chains add and fork/join takes its slowest branch (the paper's rule); False adds every
        operator, as a one-op-at-a-time executor spends it.
        """
        get = time_of if callable(time_of) else time_of.__getitem__
        concurrent = self.concurrent_branches if concurrent is None else concurrent
        if not concurrent:
            return float(sum(get(n.signature) for n in self.nodes))
        finish: dict[str, float] = {}
        for n in self.nodes:
            finish[n.name] = get(n.signature) + max((finish[p] for p in n.inputs), default=0.0)
        return max(finish.values(), default=0.0)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": GRAPH_FORMAT,
                "concurrent_branches": self.concurrent_branches,
                "nodes": [
                    {"name": n.name, "op": n.op, "signature": n.signature, "inputs": list(n.inputs)} for n in self.nodes
                ],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> OpGraph:
        data = json.loads(text)
        if data.get("format") != GRAPH_FORMAT:
            raise ValueError(f"operator graph: unknown format {data.get('format')!r} (expected {GRAPH_FORMAT})")
        nodes = [OpNode(d["name"], d["op"], d["signature"], tuple(d["inputs"])) for d in data["nodes"]]
        return cls(nodes, bool(data.get("concurrent_branches", False)))


def _brief(exc: BaseException) -> str:
    """One line for a user: torch's errors append the graph and hints on further lines."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


# -- tracing -----------------------------------------------------------------------------------
def to_graph_module(module: Any, example: Any) -> Any:
    """torch.fx.symbolic_trace, else torch.export with a dynamic batch dimension (its .module())."""
    import torch
    from torch import fx

    try:
        return fx.symbolic_trace(module)
    except Exception as fx_exc:  # noqa: BLE001 - any tracing failure sends us to torch.export
        try:
            batch = torch.export.Dim("batch", min=1, max=1 << 16)
            exported = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
            return exported.module()
        except Exception as exc:  # noqa: BLE001
            raise TraceError(
                f"cannot trace the model: torch.fx: {_brief(fx_exc)}; torch.export: {_brief(exc)}"
            ) from None


def _op_name(gm: Any, node: Any) -> tuple[str, str]:
    """(short name, full description) of what a node calls; a module's description has its config."""
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        name = type(mod).__name__
        return name, f"{name}({mod.extra_repr()})"
    if node.op == "call_method":
        return str(node.target), f"Tensor.{node.target}"
    target = node.target
    if hasattr(target, "_schema") or not callable(target):  # an OpOverload from torch.export: aten.x.default
        return str(getattr(target, "__name__", target)), str(target)
    name = str(getattr(target, "__name__", repr(target)))
    mod = getattr(target, "__module__", None) or "torch"  # torch.relu & co. have no module
    qual = getattr(target, "__qualname__", name)
    if qual.startswith("_VariableFunctionsClass.") or mod.startswith("torch._C"):
        mod, qual = "torch", name
    return name, f"{mod.removeprefix('_')}.{qual}"


def _describe(value: Any) -> Any:
    """A JSON-able description of an argument: tensors by dtype and shape, scalars by value."""
    import torch

    if isinstance(value, torch.Tensor):
        return ["T", str(value.dtype).removeprefix("torch."), list(value.shape)]
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, torch.dtype | torch.memory_format | torch.layout):
        return str(value)
    if isinstance(value, torch.device):
        return "<device>"
    if isinstance(value, slice):
        return ["slice", _describe(value.start), _describe(value.stop), _describe(value.step)]
    return f"<{type(value).__name__}>"


def _merge(a: Any, b: Any) -> Any:
    """Two descriptions of one argument at two batch sizes: what differs becomes '*'."""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [_merge(x, y) for x, y in zip(a, b, strict=True)]
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return {k: _merge(a[k], b[k]) for k in a}
    return a if a == b else "*"


def _render(d: Any) -> str:
    if isinstance(d, list) and len(d) == 3 and d[0] == "T" and isinstance(d[2], list):
        return f"{d[1]}[{','.join(str(x) for x in d[2])}]"
    if isinstance(d, list):
        return "(" + ",".join(_render(x) for x in d) + ")"
    if isinstance(d, dict):
        return "{" + ",".join(f"{k}={_render(v)}" for k, v in d.items()) + "}"
    return repr(d) if isinstance(d, str) and d != "*" else str(d)


def _record_args(gm: Any, example: Any) -> dict[str, tuple[Any, Any]]:
    """Run the graph once; per operator node, the description of its (args, kwargs)."""
    import torch
    from torch import fx

    seen: dict[str, tuple[Any, Any]] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            if n.op in OPS:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                seen[n.name] = (_describe(args), _describe(kwargs))
            return super().run_node(n)

    with torch.inference_mode():
        Recorder(gm).run(example)
    return seen


def build_graph(gm: Any, make_input: Callable[[int], Any], concurrent_branches: bool = False) -> OpGraph:
    """The operator graph of a GraphModule; `make_input(b)` gives an example batch of b."""
    probes = [_record_args(gm, make_input(b)) for b in PROBE_BATCHES]
    ops = {n.name for n in gm.graph.nodes if n.op in OPS}
    nodes = []
    for n in gm.graph.nodes:
        if n.op not in OPS or n.target == "_guards_fn":  # torch.export's input guards: not the model's work
            continue
        short, full = _op_name(gm, n)
        if n.name not in probes[0] or n.name not in probes[1]:
            raise TraceError(f"operator {n.name} ({full}) did not run at every batch size")
        args = _merge(probes[0][n.name][0], probes[1][n.name][0])
        kwargs = _merge(probes[0][n.name][1], probes[1][n.name][1])
        sig = f"{full}{_render(args)}" + (_render(kwargs) if kwargs else "")
        inputs = tuple(dict.fromkeys(p.name for p in n.all_input_nodes if p.name in ops))
        nodes.append(OpNode(n.name, short, sig, inputs))
    return OpGraph(nodes, concurrent_branches)


def trace_model(
    module: Any, make_input: Callable[[int], Any], concurrent_branches: bool = False
) -> tuple[Any, OpGraph]:
    """(GraphModule, OpGraph) of an nn.Module; TraceError when it cannot be traced or run."""
    import torch

    with torch.inference_mode():
        example = make_input(PROBE_BATCHES[0])
    gm = to_graph_module(module, example)
    try:
        graph = build_graph(gm, make_input, concurrent_branches)
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's own error on this input
        raise TraceError(f"the model fails on an input of shape {tuple(example.shape)}: {_brief(exc)}") from None
    return gm, graph
