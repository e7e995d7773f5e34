"""The artifacts a GPU Manager loads, and why loading and running them runs no uploader's code.

The manager loads models as root for anyone whose request reaches the scheduler, so it accepts
only formats whose loading is data, not code, and checks each of them before torch sees it:

- **`torch.save` pickles: refused** (upload: 400; on disk: never loaded). Unpickling calls any
  global the file names (`__reduce__` -> `os.system`). `weights_only=True` would be safe but
  holds weights without the architecture, which only the function's own code can rebuild: it
  does so in its instance (`faas_gpu.remote(module)`), where the user's code already runs.
- **`torch.export` programs (`.pt2`)**: torch 2.13's `torch.export.load` is not safe as it is
  (its docs: "uses pickle under the hood"). Read in `torch/export/pt2_archive/_package.py` and
  `torch/_export/serde/serialize.py`, it (1) unpickles weights and constants marked
  `use_pickle` with `torch.load(weights_only=False)` and "opaque" constants with
  `pickle.loads`; (2) loads sample inputs with `weights_only=True` and, when that fails, again
  with `weights_only=False`; (3) loads AOTInductor shared libraries from `data/aotinductor/`;
  (4) resolves node targets by walking attributes from `torch`, `_operator` or `math`, so a
  target `torch.os.system` is a node that calls `os.system`; (5) parses symbolic shapes with
  `sympy.sympify`, which is `eval`; (6) generates the module's Python code from names in the
  file (`getattr(self, "<name>")`, keyword names, `def forward(<arg names>)`), so a crafted name
  is code; (7) `.module()` `exec`s guard code made of the file's `guards_code` and of its
  string inputs (`f"{src} == '{meta}'"`). `check_export` refuses (1) and (3), every target
  outside the tensor operator namespaces (4), any shape expression that is not arithmetic over
  symbols (5), any name that is not a dotted identifier (6) and any `guards_code` (7), before
  torch opens the file; the worker sets `TORCH_FORCE_WEIGHTS_ONLY_LOAD` (2), builds the module
  with `check_guards=False` (7: no guard code is generated), and `check_graph` checks the loaded
  graph's targets again.
- **TorchScript archives**: `torch.jit.load` unpickles with TorchScript's C++ unpickler, which
  resolves only TorchScript types and tensor rebuilders, never a Python global, and compiles
  the archive's code with the TorchScript compiler, which cannot call Python. But TorchScript
  code runs: a class's or module's `__setstate__` at load time, and any registered operator at
  run time, including `aten::save` (writes a file: as root, that is code execution) and
  `aten::from_file` (reads one). `check_torchscript_archive` refuses code that is not ASCII or
  defines `__setstate__` before loading; `check_torchscript` refuses, after loading and before
  the first call, any operator outside the tensor namespaces, file and RPC operators, Python
  ops, and calls it cannot see into.

Every check reads the archive through `archive.Archive`, the one strict reader (no duplicate or
ambiguous names, declared sizes and ratios within limits before anything is inflated), and what
the store keeps and the workers load is that archive's canonical copy (`archive.write_canonical`):
the bytes checked here are the bytes torch reads. JSON and code are read up to a bound each
(`PROGRAM_JSON_BYTES`, `TEXT_BYTES`), whatever the archive declares.

What remains is torch's kernels' own memory safety on hostile shapes; the worker is one process
per model, so such a bug is contained to it, not to the manager, and the worker runs behind the
walls of `gpu_manager/isolation.py` (an unprivileged uid, no network, nothing of the state folder).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Iterator
from typing import Any

from faas_gpu.contract.errors import ArtifactError

from .archive import Archive
from .batch_limits import TORCHSCRIPT, BatchLimits, of_program

PICKLE_REFUSED = (
    "artifact: a torch.save pickle is refused (loading one runs any code it names). Send a "
    "torch.export program (faas_gpu.save_model(model, example_input, 'model.pt2'), or torch.export.save "
    "with a torch.export.Dim batch dimension) or, for an old model, a TorchScript archive; in a python3-gpu "
    "handler, build the module from a state dict or safetensors and call faas_gpu.remote(module), which "
    "exports it in the instance"
)

PROGRAM_JSON_BYTES = 64 << 20  # models/model.json: ~1.2 KB a graph node (566 nodes: 669 KB)
TEXT_BYTES = 16 << 20  # any other entry a check reads: configs, TorchScript code, a pickle's opcodes

_DOTTED = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")  # "layer1.0.weight": FX quotes "0" safely
_SYMBOL = re.compile(r"^[a-z]+[0-9]*$")  # s0, u3, ...: the names export gives shape symbols

EXPORT_FILES = {"archive_format", "archive_version", "byteorder", "version", ".data/version", ".data/serialization_id"}
EXPORT_DIRS = ("models/", "data/weights/", "data/constants/", "data/sample_inputs/", "data/extra/", "extra/")
OP_NAMESPACES = {"aten", "prims", "quantized_decomposed"}
HIGHER_ORDER_OPS = {
    "cond",
    "while_loop",
    "map_impl",
    "scan",
    "wrap_with_set_grad_enabled",
    "wrap_with_autocast",
    "auto_functionalized",
    "auto_functionalized_v2",
}
DENIED_OPS = {"aten.from_file", "aten.save", "aten._load", "debugprims.load_tensor"}
OPERATOR_FUNCTIONS = {
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
    "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift",
}  # fmt: skip
SYM_FUNCTIONS = {
    "torch.sym_int", "torch.sym_float", "torch.sym_ite", "torch.sym_max", "torch.sym_min",
    "torch.sym_not", "torch.sym_sum", "torch.sym_sqrt", "torch._sym_sqrt",
}  # fmt: skip
SYMPY_NAMES = {
    "Symbol", "Integer", "Float", "Rational", "Max", "Min", "Mod", "FloorDiv", "CeilDiv", "CleanDiv",
    "PythonMod", "TruncToInt", "TruncToFloat", "IntTrueDiv", "FloatTrueDiv", "ToFloat", "Abs", "Eq",
    "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "sqrt", "floor", "ceiling", "Pow",
    "PowByNatural", "FloatPow", "RoundToInt", "RoundDecimal", "Identity", "True", "False", "oo",
    "LShift", "RShift", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "ModularIndexing", "Where",
    "CeilToInt", "FloorToInt",
}  # fmt: skip
SYMPY_KEYWORDS = {"positive", "integer", "real", "nonnegative", "negative", "finite", "nonzero", "commutative"}
_EXPR_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.Name, ast.Constant,
    ast.keyword, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)  # fmt: skip

TORCHSCRIPT_NAMESPACES = {"aten", "prim", "prims", "quantized", "_quantized", "quantized_decomposed", "profiler"}
TORCHSCRIPT_DENIED = {
    "aten::save",
    "aten::from_file",
    "prim::PythonOp",
    "prim::IgnoredPythonOp",
    "prim::rpc_async",
    "prim::rpc_sync",
    "prim::rpc_remote",
    "prim::CallFunction",  # left after inlining: a call we cannot see into
    "prim::CallMethod",
}


def detect_format(z: Archive) -> str:
    """torchscript or export, from the archive's layout; ArtifactError (naming what to send
    instead) for a pickle or anything else, and for an archive that fails its format's checks."""
    return _detect(z)[0]


def detect(z: Archive) -> tuple[str, BatchLimits]:
    """`detect_format`, and the batch the model accepts (`batch_limits`), read from the same
    checked JSON; a malformed batch field is an ArtifactError naming it."""
    fmt, program = _detect(z)
    return fmt, TORCHSCRIPT if program is None else of_program(program)


def _detect(z: Archive) -> tuple[str, Any]:
    names = z.names()
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or any("/" not in n for n in names):
        raise ArtifactError("artifact: a torch archive has every entry under one folder")
    root = roots.pop() + "/"
    parts = {n[len(root) :]: n for n in names}
    if any(p.startswith("code/") for p in parts) and "constants.pkl" in parts:
        check_torchscript_archive(z, parts)
        return "torchscript", None
    if "models/model.json" in parts or "archive_format" in parts:
        return "export", check_export(z, parts)
    if "data.pkl" in parts:
        raise ArtifactError(PICKLE_REFUSED)
    if "serialized_exported_program.json" in parts:
        raise ArtifactError("artifact: an export archive of torch < 2.8's format; save it again with torch.export.save")
    raise ArtifactError("artifact: a zip archive, but not TorchScript or a torch.export program")


def pickled_class(z: Archive) -> str | None:
    """The dotted name of the class a `torch.save` pickle's top object is made from (`model.Net`,
    `collections.OrderedDict` for a state dict), read from the opcodes without unpickling; None when
    the archive holds no pickle or names none. Only to word an error: nothing is imported or run."""
    import pickletools

    pkl = [n for n in z.names() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkl) != 1:
        return None
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(z.read(pkl[0], TEXT_BYTES)):
            if op.name == "GLOBAL" and isinstance(arg, str):
                return ".".join(arg.split(" ", 1))
            if op.name == "STACK_GLOBAL" and len(strings) >= 2:
                return f"{strings[-2]}.{strings[-1]}"
            if isinstance(arg, str):
                strings.append(arg)
    except (ValueError, EOFError, KeyError, UnicodeDecodeError):  # ArtifactError too: a ValueError
        return None
    return None


# -- TorchScript ---------------------------------------------------------------------------------
def check_torchscript_archive(z: Archive, parts: dict[str, str]) -> None:
    for part, name in parts.items():
        if not (part.startswith("code/") and part.endswith(".py")):
            continue
        source = z.read(name, TEXT_BYTES)
        try:
            text = source.decode("ascii")
        except UnicodeDecodeError:
            raise ArtifactError(f"artifact: TorchScript code {part} is not ASCII") from None
        if "__setstate__" in text:
            raise ArtifactError(
                f"artifact: TorchScript code {part} defines __setstate__, which runs at load time; "
                "send a torch.export program instead"
            )


def check_torchscript(module: Any) -> None:
    """Every method of the loaded module and its submodules, inlined, uses allowed operators only."""
    import torch

    for _, sub in module.named_modules():
        c = sub._c
        for method in c._method_names():
            graph = c._get_method(method).graph.copy()
            torch._C._jit_pass_inline(graph)
            for node in _ts_nodes(graph):
                kind = node.kind()
                namespace = kind.split("::", 1)[0]
                if kind in TORCHSCRIPT_DENIED or namespace not in TORCHSCRIPT_NAMESPACES:
                    raise ArtifactError(f"artifact: TorchScript method {method} uses {kind}, which is not allowed")
                for out in node.outputs():
                    t = str(out.type())
                    if "torch.classes." in t and "torch.classes.quantized." not in t:
                        raise ArtifactError(f"artifact: TorchScript method {method} uses the custom class {t}")


def _ts_nodes(graph) -> Iterator[Any]:
    for node in graph.nodes():
        yield node
        for block in node.blocks():
            yield from _ts_nodes(block)
        for attr in node.attributeNames():
            if node.kindOf(attr) == "g":
                yield from _ts_nodes(node.g(attr))


# -- torch.export --------------------------------------------------------------------------------
def check_export(z: Archive, parts: dict[str, str]) -> Any:
    """The program's JSON (`models/model.json`), checked."""
    for part in parts:
        if part in EXPORT_FILES or part.startswith(EXPORT_DIRS):
            continue
        raise ArtifactError(f"artifact: {part} has no place in a torch.export program (AOTInductor code is refused)")
    if "archive_format" not in parts or z.read(parts["archive_format"], 64).strip() != b"pt2":
        raise ArtifactError("artifact: a torch.export program says archive_format pt2")
    models = [p for p in parts if p.startswith("models/")]
    if models != ["models/model.json"]:
        raise ArtifactError(f"artifact: a torch.export program holds models/model.json alone, not {models}")
    for part in parts:
        if part.startswith(("data/weights/", "data/constants/")) and part.endswith(".pt"):
            raise ArtifactError(
                f"artifact: {part} is a pickle (torch < 2.8's layout); save it again with torch.export.save"
            )
    for config, dir_ in (
        ("data/weights/model_weights_config.json", "weights"),
        ("data/constants/model_constants_config.json", "constants"),
    ):
        if config in parts:
            _check_payloads(_json(z, parts[config], config, TEXT_BYTES), dir_)
    program = _json(z, parts["models/model.json"], "models/model.json", PROGRAM_JSON_BYTES)
    _check_program(program)
    return program


def _json(z: Archive, name: str, part: str, limit: int) -> Any:
    data = z.read(name, limit)
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ArtifactError(f"artifact: {part} is not JSON") from None


def _check_payloads(config: Any, dir_: str) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ArtifactError(f"artifact: the {dir_} config has no config object")
    for fqn, meta in entries.items():
        _check_name(fqn, f"{dir_} {fqn!r}")
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise ArtifactError(f"artifact: {dir_} {fqn} is pickled; save the program with plain tensors")
        path = meta.get("path_name")
        if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z0-9_]+", path):
            raise ArtifactError(f"artifact: {dir_} {fqn} has a bad path_name")
        if dir_ == "constants" and not path.startswith("tensor_"):
            raise ArtifactError(f"artifact: constant {fqn} is a custom or opaque object (pickled); refused")


def _check_name(value: Any, where: str, empty_ok: bool = False) -> None:
    if not isinstance(value, str) or not (_DOTTED.match(value) or (empty_ok and value == "")):
        raise ArtifactError(f"artifact: {where} is not a dotted name of letters, digits and _")


def _check_program(program: Any) -> None:
    """Walk the program's JSON: names, operator targets and shape expressions (metadata aside)."""
    stack: list[tuple[Any, str]] = [(program, "")]
    while stack:
        value, key = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if k == "metadata":
                    continue  # stack traces and module paths: kept as data, never code or names
                if k == "range_constraints" and isinstance(v, dict):
                    for expr in v:
                        _check_expr(expr)
                if k in ("target", "as_operator") and isinstance(v, str):
                    _check_target(v)
                elif k == "expr_str":
                    _check_expr(v)
                elif k == "forward_arg_names":
                    for arg in v if isinstance(v, list) else [v]:
                        if not (isinstance(arg, str) and arg.isidentifier() and arg.isascii()):
                            raise ArtifactError(f"artifact: forward argument {arg!r} is not an identifier")
                elif (k.endswith("name") or k == "fqn" or k.endswith("_fqn")) and isinstance(v, str):
                    _check_name(v, f"{k} {v!r}", empty_ok=k.endswith("fqn"))
                elif k in ("custom_obj_values",) and v:
                    raise ArtifactError("artifact: custom objects (torchbind) are refused")
                elif k == "guards_code" and v:
                    raise ArtifactError("artifact: guards_code is Python that torch would exec; refused")
                else:
                    stack.append((v, k))
        elif isinstance(value, list):
            stack.extend((v, key) for v in value)


def _check_target(target: str) -> None:
    parts = target.split(".")
    ok = False
    if target.startswith("torch.ops.") and len(parts) >= 4:
        ns, op = parts[2], parts[3]
        if ns == "higher_order":
            ok = op in HIGHER_ORDER_OPS and len(parts) == 4
        else:
            ok = ns in OP_NAMESPACES and f"{ns}.{op}" not in DENIED_OPS and len(parts) == 5
    elif target.startswith("_operator."):
        ok = len(parts) == 2 and parts[1] in OPERATOR_FUNCTIONS
    elif target.startswith("math."):
        ok = len(parts) == 2 and parts[1].isidentifier() and not parts[1].startswith("_")
    else:
        ok = target in SYM_FUNCTIONS
    if not ok:
        raise ArtifactError(f"artifact: operator {target!r} is not allowed in a program the manager runs")


def _check_expr(expr: Any) -> None:
    """Only arithmetic over shape symbols: sympy.sympify evaluates the string as Python."""
    if not isinstance(expr, str) or len(expr) > 10_000:
        raise ArtifactError("artifact: a shape expression is not a short string")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # MemoryError: nested past the parser's stack
        raise ArtifactError(f"artifact: shape expression {expr[:80]!r} does not parse") from None
    for node in ast.walk(tree):
        if not isinstance(node, _EXPR_NODES):
            raise ArtifactError(f"artifact: shape expression {expr[:80]!r} is not arithmetic ({type(node).__name__})")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in SYMPY_NAMES):
            raise ArtifactError(
                f"artifact: shape expression {expr[:80]!r} calls something other than sympy's functions"
            )
        if isinstance(node, ast.Name) and node.id not in SYMPY_NAMES and not _SYMBOL.match(node.id):
            raise ArtifactError(f"artifact: shape expression {expr[:80]!r} names {node.id!r}")
        if isinstance(node, ast.keyword) and node.arg not in SYMPY_KEYWORDS:
            raise ArtifactError(f"artifact: shape expression {expr[:80]!r} passes {node.arg!r}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | bool | str):
            raise ArtifactError(f"artifact: shape expression {expr[:80]!r} has a constant of another kind")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and not _SYMBOL.match(node.value):
            raise ArtifactError(f"artifact: shape expression {expr[:80]!r} names symbol {node.value!r}")


def check_graph(module: Any, rewritten_with: Collection[Any] = ()) -> None:
    """After torch.export.load: every call in the module's graphs is an allowed operator.

    `rewritten_with` is for one caller only: the worker's own inference rewrite of a graph that
    passed this check as loaded (`gpu_manager/optimize.py`), naming the operator overloads that
    rewrite inserts (oneDNN's fused convolutions, outside the namespaces an artifact may call).
    An artifact is always checked without it, so an upload that calls them is still refused."""
    import math
    import operator

    import torch

    allowed_python = {getattr(operator, f) for f in OPERATOR_FUNCTIONS if hasattr(operator, f)}
    for name in SYM_FUNCTIONS:
        fn = getattr(torch, name.split(".", 1)[1], None)
        if fn is not None:
            allowed_python.add(fn)
    for _, sub in module.named_modules():
        graph = getattr(sub, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            if node.op == "call_module":  # torch's own guards: a graph, checked in its turn
                if hasattr(sub.get_submodule(node.target), "graph"):
                    continue
                raise ArtifactError(f"artifact: graph node {node.name} calls a module that is not a graph")
            target = node.target
            if node.op != "call_function":
                raise ArtifactError(f"artifact: graph node {node.name} is a {node.op}, not an operator call")
            if isinstance(target, torch._ops.OpOverload):
                if target in rewritten_with:
                    continue
                ns = target.namespace
                if ns in OP_NAMESPACES and f"{ns}.{target._opname}" not in DENIED_OPS:
                    continue
            elif isinstance(target, torch._ops.HigherOrderOperator):
                if target.name() in HIGHER_ORDER_OPS:
                    continue
            elif (
                target in allowed_python
                or getattr(target, "__module__", None) == "math"
                or target in vars(math).values()
            ):
                continue
            raise ArtifactError(f"artifact: graph node {node.name} calls {target!r}, which is not allowed")
