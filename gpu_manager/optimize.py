"""A loaded model made cheaper to run on the cpu back end, checked against itself before use.

What oneDNN-backed serving stacks do for CPU inference (Intel's extension for PyTorch behind
TorchServe, `ipex.optimize`): two rewrites of the torch.export program's graph, neither of
which changes what the model computes beyond float rounding:

- **conv-bn folding**: an eval-mode batch norm right after a convolution is an affine map per
  output channel, so it folds into the convolution's weight and bias
  (`torch.nn.utils.fusion.fuse_conv_bn_weights`) and the batch norm's pass over the activations
  is gone.
- **channels-last weights**: a 2-D convolution whose weight is channels-last runs oneDNN's NHWC
  kernels, and its output stays channels-last for the ops after it.
- **fused convolutions**: a 2-D convolution followed by a relu, or by an add and a relu (a
  residual block's end), becomes one call of oneDNN's `mkldnn._convolution_pointwise`, which
  applies the relu (and the add) to each output tile while it is in cache, instead of a pass of
  its own over the activations; what inductor's CPU fusion emits. Those operators are outside
  the namespaces an artifact may call (`safe_formats.check_graph`): the rewritten graph is checked
  with exactly the overloads this rewrite inserts allowed beside them, never an uploaded one.

Measured on ResNetMini (the classify example), one thread, this 2-core machine: 0.93-1.04 ms of
CPU an image at batch 8 before, 0.60 after; 1.56 -> 1.18 at batch 1 (issue 20). The fused
convolutions took about 5% more off the worker's CPU at batch 8 (docs/EXPERIMENTS.md, session 40).

Why it is safe to do to anyone's model: it runs only on the cpu device (not measured on a GPU,
so not done there), only on float32 tensors, and only where the pattern is exact (the
convolution's one user is the batch norm, every weight a graph constant). The rewritten model
is then run on the program's own example input beside the original, and kept only when its
answer matches (`RTOL`, `ATOL`); anything else (no example input, an error, a mismatch: a
`view` that channels-last strides refuse, say) leaves the model exactly as it was loaded,
with the reason in the worker's load report. The original weights a rewrite replaced are dropped
once it is kept, so the model holds one copy. A GPU Manager started with `--no-optimize` skips
all of it (`ENV`).
"""

from __future__ import annotations

import copy
import functools
import operator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

ENV = "FAAS_GPU_OPTIMIZE"
"""Set to "0" in a worker's environment (the manager's `--no-optimize`): models are served as loaded."""
RTOL, ATOL = 1e-4, 1e-5
"""How close the rewritten model's answer on the example input must be to the original's."""
ATTR_PREFIX = "_faas_gpu_opt_"


@dataclass
class Optimized:
    """What was done to a model: the rewrites kept (empty when none), or why none was."""

    applied: list[str] = field(default_factory=list)
    skipped: str | None = None


def for_inference(model: Any, example: tuple | None, device: str, enabled: bool = True) -> Optimized:
    """Rewrites `model` (a torch.export program's module) in place when that is safe and checked."""
    import torch

    if not enabled:
        return Optimized(skipped="turned off (--no-optimize)")
    if device != "cpu":
        return Optimized(skipped=f"not done on {device} (measured on the cpu back end only)")
    if not isinstance(model, torch.fx.GraphModule):
        return Optimized(skipped="not a torch.export program")
    if example is None:
        return Optimized(skipped="no example input to check a rewrite against")
    if not any(_is_conv(node) for node in model.graph.nodes):  # before copying the graph: a big model's copy costs
        return Optimized(skipped="nothing to rewrite (no convolution)")
    expected = None
    applied: list[str] = []
    # in stages, each checked on its own: fused convolutions that do not match keep the folded,
    # channels-last model rather than taking it back to the model as loaded
    for stage in (_Rewrite.layout, _Rewrite.fuse_pointwise):
        rewrite = _Rewrite(model)
        try:
            done = stage(rewrite)
        except Exception as exc:  # noqa: BLE001 - a graph the rewrite did not foresee: served without it
            rewrite.undo()
            return Optimized(applied=applied, skipped=f"a rewrite failed on this graph: {_brief(exc)}")
        if not done:
            rewrite.undo()
            continue
        if expected is None:
            try:
                with torch.inference_mode():
                    expected = model(*example)
            except Exception as exc:  # noqa: BLE001 - the warm-up batch reports it; nothing to check against
                rewrite.undo()
                return Optimized(skipped=f"the example input fails on the model as loaded: {_brief(exc)}")
        try:
            rewrite.install()
            with torch.inference_mode():
                got = model(*example)
            torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL, check_stride=False)
        except Exception as exc:  # noqa: BLE001 - any failure of the rewritten model keeps the model before it
            rewrite.undo()
            return Optimized(
                applied=applied,
                skipped=f"the rewritten model ({', '.join(done)}) did not match the original on the example input: "
                f"{_brief(exc)}",
            )
        rewrite.drop_replaced()
        applied += done
    if not applied:
        return Optimized(skipped="nothing to rewrite (no conv-bn pair, conv weights channels-last or not float32)")
    return Optimized(applied=applied)


def _same_tensor_shape(a: Any, b: Any, torch: Any) -> bool:
    """Both nodes float32 tensors of one known shape (export's `meta["val"]`), else False."""
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor):
        return False
    try:  # sizes may be symbols (a dynamic batch): the same symbol compares equal
        return bool(va.dtype == vb.dtype == torch.float32 and va.shape == vb.shape)
    except Exception:  # noqa: BLE001 - a comparison the symbols cannot decide: not fused
        return False


def _brief(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:200]


@functools.cache
def _ops() -> SimpleNamespace:
    """The operators the rewrites match and insert (looked up once: torch is imported lazily here)."""
    import torch

    aten = torch.ops.aten
    fused = getattr(torch.ops.mkldnn, "_convolution_pointwise", None) if torch.backends.mkldnn.is_available() else None
    return SimpleNamespace(
        convs={aten.conv1d.default, aten.conv2d.default, aten.conv3d.default},
        conv2d=aten.conv2d.default,
        convolution=aten.convolution.default,
        batch_norm=aten.batch_norm.default,
        batch_norm_no_training=aten._native_batch_norm_legit_no_training.default,
        relu=aten.relu.default,
        add=aten.add.Tensor,
        # oneDNN's conv + pointwise (None where this torch is built without oneDNN)
        conv_unary=None if fused is None else fused.default,
        conv_binary=None if fused is None else fused.binary,
    )


def fused_ops() -> frozenset:
    """The operator overloads `fuse_pointwise` inserts: what the rewritten graph's check allows
    beyond an artifact's namespaces."""
    ops = _ops()
    return frozenset(op for op in (ops.conv_unary, ops.conv_binary) if op is not None)


def _is_conv(node: Any) -> bool:
    """A convolution, not transposed (export's `conv1d/2d/3d`; `convolution` once decomposed)."""
    if node.op != "call_function":
        return False
    ops = _ops()
    if node.target in ops.convs:
        return True
    return node.target is ops.convolution and len(node.args) > 6 and node.args[6] is False


class _Rewrite:
    """The rewrites on a copy of the graph, new tensors as new attributes of the module: `install`
    swaps the copy in, `undo` swaps the original back and removes the new attributes."""

    def __init__(self, module: Any):
        self.module = module
        self.original = module.graph
        self.graph = copy.deepcopy(module.graph)
        self.added: list[str] = []
        self.replaced: set[str] = set()

    # -- the rewrites -------------------------------------------------------------------------

    def fold_conv_bn(self) -> list[str]:
        import torch
        from torch.nn.utils.fusion import fuse_conv_bn_weights

        folded = 0
        for bn in list(self.graph.nodes):
            got = self._batch_norm(bn)
            if got is None:
                continue
            conv, (w, b, mean, var, eps), outs = got
            if not _is_conv(conv) or len(conv.users) != 1:
                continue
            # the conv's weight and bias, the norm's weight and bias, its running mean and variance:
            # each a float32 graph constant, or absent where torch allows it (the biases, the affine pair)
            nodes = (conv.args[1], conv.args[2] if len(conv.args) > 2 else None, w, b, mean, var)
            values = [None if n is None else self._constant(n) for n in nodes]
            given = [v for n, v in zip(nodes, values, strict=True) if n is not None]
            if nodes[0] is None or mean is None or var is None:
                continue
            if not all(v is not None and v.dtype == torch.float32 for v in given):
                continue
            cw, cb, bw, bb, rm, rv = values
            fw, fb = fuse_conv_bn_weights(cw, cb, rm, rv, eps, bw, bb)
            with self.graph.inserting_before(conv):
                w_node = self._attribute(f"fold{folded}_weight", fw.detach())
                b_node = self._attribute(f"fold{folded}_bias", fb.detach())
            self._note_replaced(*nodes)
            conv.args = (conv.args[0], w_node, b_node, *conv.args[3:])
            for out in outs:
                out.replace_all_uses_with(conv)
                if out is not bn:  # the getitem of a batch norm that answers a tuple
                    self.graph.erase_node(out)
            self.graph.erase_node(bn)
            folded += 1
        self._tidy()
        return ["fold_conv_bn"] if folded else []

    def layout(self) -> list[str]:
        """The first stage: the batch norms folded, then the final weights made channels-last."""
        return self.fold_conv_bn() + self.channels_last()

    def channels_last(self) -> list[str]:
        import torch

        done = 0
        for conv in list(self.graph.nodes):
            if not _is_conv(conv):
                continue
            weight = self._constant(conv.args[1])
            if weight is None or weight.dim() != 4 or weight.is_contiguous(memory_format=torch.channels_last):
                continue
            with self.graph.inserting_before(conv):
                node = self._attribute(f"nhwc{done}_weight", weight.contiguous(memory_format=torch.channels_last))
            self._note_replaced(conv.args[1])
            conv.args = (conv.args[0], node, *conv.args[2:])
            done += 1
        self._tidy()
        return ["channels_last"] if done else []

    def fuse_pointwise(self) -> list[str]:
        """relu(conv2d(x)) and relu(conv2d(x) + y) as one oneDNN call each (float32 weights:
        `channels_last` and `fold_conv_bn` have already run, so the weights are the final ones)."""
        import torch

        ops = _ops()
        if ops.conv_unary is None or ops.conv_binary is None:
            return []
        fused = 0
        for relu in list(self.graph.nodes):
            if relu.op != "call_function" or relu.target is not ops.relu or relu.kwargs or len(relu.args) != 1:
                continue
            src = relu.args[0]
            conv = self._conv2d(src, torch)
            if conv is not None:  # relu(conv(x))
                x, w, b, stride, padding, dilation, groups = conv
                args: tuple = (x, w, b, padding, stride, dilation, groups, "relu", [], "")
                target, gone = ops.conv_unary, [src]
            elif (
                getattr(src, "target", None) is ops.add
                and not src.kwargs
                and len(src.args) == 2
                and len(src.users) == 1
            ):
                conv_node, other = src.args
                conv = self._conv2d(conv_node, torch)
                if conv is None:  # the add's other side may be the convolution
                    other, conv_node = conv_node, other
                    conv = self._conv2d(conv_node, torch)
                if conv is None or not isinstance(other, torch.fx.Node) or other is conv_node:
                    continue
                if not _same_tensor_shape(conv_node, other, torch):  # oneDNN's add takes no broadcast
                    continue
                x, w, b, stride, padding, dilation, groups = conv
                args = (x, other, w, b, padding, stride, dilation, groups, "add", 1.0, "relu", [], "")
                target, gone = ops.conv_binary, [src, conv_node]
            else:
                continue
            with self.graph.inserting_before(relu):
                node = self.graph.call_function(target, args)
            node.meta = dict(relu.meta)
            relu.replace_all_uses_with(node)
            self.graph.erase_node(relu)
            for old in gone:
                self.graph.erase_node(old)
            fused += 1
        return ["fuse_conv_pointwise"] if fused else []

    # -- swapping the graph -------------------------------------------------------------------

    def install(self) -> None:
        from faas_gpu.models import safe_formats

        self.graph.lint()
        self.module.graph = self.graph  # the module's code regenerated from the graph
        # the check the loaded graph passed, with only the fused convolutions this rewrite inserts allowed beside it
        safe_formats.check_graph(self.module, rewritten_with=fused_ops())

    def undo(self) -> None:
        if self.module.graph is not self.original:  # installed: the original back (its code regenerated)
            self.module.graph = self.original
        for name in self.added:
            if hasattr(self.module, name):
                delattr(self.module, name)

    def drop_replaced(self) -> None:
        """The original tensors nothing refers to any more, gone from the module (one copy held)."""
        used = {n.target for n in self.module.graph.nodes if n.op == "get_attr"}
        for target in self.replaced - used:
            owner, _, name = target.rpartition(".")
            holder = self.module.get_submodule(owner) if owner else self.module
            if hasattr(holder, name):
                delattr(holder, name)

    # -- helpers -------------------------------------------------------------------------------

    def _batch_norm(self, node: Any) -> tuple[Any, tuple, list[Any]] | None:
        """(input node, (weight, bias, mean, var, eps), the nodes its output goes through) of an
        eval-mode batch norm, else None."""
        if node.op != "call_function":
            return None
        ops = _ops()
        if node.target is ops.batch_norm:
            args = node.args
            if len(args) < 8 or args[5] is not False:
                return None
            return args[0], (args[1], args[2], args[3], args[4], float(args[7])), [node]
        if node.target is ops.batch_norm_no_training:
            args = node.args
            users = list(node.users)
            if len(args) < 7 or not all(u.target is operator.getitem and u.args[1] == 0 for u in users):
                return None
            return args[0], (args[1], args[2], args[3], args[4], float(args[6])), users
        return None

    def _conv2d(self, node: Any, torch: Any) -> tuple | None:
        """(input, weight, bias, stride, padding, dilation, groups) of a plain 2-D convolution whose
        one user is the node being fused and whose tensors are float32 graph constants, else None."""
        if getattr(node, "op", None) != "call_function" or node.kwargs or len(node.users) != 1:
            return None
        ops = _ops()
        args = list(node.args)
        if node.target is ops.conv2d:
            args += [None, [1, 1], [0, 0], [1, 1], 1][len(args) - 2 :] if len(args) < 7 else []
            x, w, b, stride, padding, dilation, groups = args[:7]
        elif node.target is ops.convolution and len(args) == 9 and args[6] is False:
            x, w, b, stride, padding, dilation, _, output_padding, groups = args
            if any(output_padding):
                return None
        else:
            return None
        weight = self._constant(w)
        bias = None if b is None else self._constant(b)
        if weight is None or weight.dim() != 4 or weight.dtype != torch.float32 or (b is not None and bias is None):
            return None
        if bias is not None and bias.dtype != torch.float32:
            return None
        spec = [
            list(v) * (2 if len(v) == 1 else 1) if isinstance(v, list | tuple) else None
            for v in (stride, padding, dilation)
        ]
        if any(v is None or len(v) != 2 or not all(isinstance(i, int) for i in v) for v in spec):
            return None  # a string padding ("same"), a symbolic size: left as it is
        if not isinstance(groups, int) or not isinstance(x, torch.fx.Node):
            return None
        return x, w, b, *spec, groups

    def _constant(self, node: Any) -> Any:
        import torch

        if getattr(node, "op", None) != "get_attr":
            return None
        value: Any = self.module
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        return value if isinstance(value, torch.Tensor) else None

    def _attribute(self, suffix: str, tensor: Any) -> Any:
        name = ATTR_PREFIX + suffix
        self.module.register_buffer(name, tensor)
        self.added.append(name)
        return self.graph.get_attr(name)

    def _note_replaced(self, *nodes: Any) -> None:
        self.replaced |= {str(n.target) for n in nodes if getattr(n, "op", None) == "get_attr"}

    def _tidy(self) -> None:
        for node in list(self.graph.nodes):
            if node.op == "get_attr" and not node.users:
                self.graph.erase_node(node)
