"""The workers' inference rewrites (`gpu_manager/optimize.py`): kept only when the rewritten model
answers as the original did, the original left untouched otherwise, and reported by the worker."""

from __future__ import annotations

import operator

import pytest
import torch

from faas_gpu.contract.wire import decode, encode
from faas_gpu.models import ModelStore
from faas_gpu.saving import export_program
from gpu_manager import optimize
from gpu_manager.discovery import cpu_units
from gpu_manager.manager import GPUManager
from tests.classify_model import ResNetMini

aten = torch.ops.aten


def trained_like(model: torch.nn.Module) -> torch.nn.Module:
    """Batch norms with statistics and affine parameters away from their identity defaults, so a
    fold that got any of them wrong shows in the answer."""
    gen = torch.Generator().manual_seed(7)
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        n = bn.num_features
        bn.running_mean.copy_(torch.randn(n, generator=gen) * 0.5)
        bn.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
        bn.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
        bn.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    return model.eval()


def program(model: torch.nn.Module, decomposed: bool = False) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (torch.randn(4, 3, 32, 32),), dynamic_shapes=({0: batch},))
    return ep.run_decompositions() if decomposed else ep


def module_and_example(ep: torch.export.ExportedProgram):
    return ep.module(check_guards=False), tuple(ep.example_inputs[0])


def targets(module) -> list:
    return [n.target for n in module.graph.nodes if n.op == "call_function"]


BATCH_NORMS = {aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default}


@pytest.mark.parametrize("decomposed", [False, True], ids=["export", "decomposed"])
def test_conv_bn_folds_and_weights_go_channels_last_with_the_same_answers(decomposed):
    reference = trained_like(ResNetMini())
    model, example = module_and_example(program(reference, decomposed))
    before = sum(t.numel() for t in [*model.parameters(), *model.buffers()])
    done = optimize.for_inference(model, example, "cpu")
    assert done.applied == ["fold_conv_bn", "channels_last", "fuse_conv_pointwise"] and done.skipped is None
    assert not BATCH_NORMS & set(targets(model))
    assert operator.getitem not in targets(model)  # the decomposed batch norms' getitems went with them
    assert aten.relu.default not in targets(model)  # every relu follows a conv, or a conv's residual add
    convs = [n for n in model.graph.nodes if n.target in (aten.conv2d.default, aten.convolution.default)]
    unary = [n for n in model.graph.nodes if n.target is torch.ops.mkldnn._convolution_pointwise.default]
    binary = [n for n in model.graph.nodes if n.target is torch.ops.mkldnn._convolution_pointwise.binary]
    # ResNetMini: the stem's conv-relu and each block's first conv-relu; each block's conv + shortcut + relu;
    # the two projection shortcuts stay plain convolutions
    assert (len(convs), len(unary), len(binary)) == (2, 7, 6)
    weights = [getattr(model, n.args[1].target) for n in convs + unary] + [
        getattr(model, n.args[2].target) for n in binary
    ]
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)
    # the batch norms' tensors and the replaced conv weights are gone: one copy of the model held
    assert sum(t.numel() for t in [*model.parameters(), *model.buffers()]) < before
    with torch.inference_mode():
        for batch in (1, 5, 32):
            x = torch.randn(batch, 3, 32, 32)
            torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)


class Flattens(torch.nn.Module):
    """A conv whose output is `view`ed: the strides of a channels-last activation refuse the view."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 32 * 32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.view(y.shape[0], -1))


def test_a_rewrite_that_fails_on_the_example_leaves_the_model_as_loaded():
    reference = trained_like(Flattens())
    model, example = module_and_example(program(reference))
    graph_before = str(model.graph)
    names_before = {name for name, _ in [*model.named_parameters(), *model.named_buffers()]}
    done = optimize.for_inference(model, example, "cpu")
    assert done.applied == [] and "did not match the original" in done.skipped and "view" in done.skipped
    assert str(model.graph) == graph_before
    assert {name for name, _ in [*model.named_parameters(), *model.named_buffers()]} == names_before
    with torch.inference_mode():
        x = torch.randn(3, 3, 32, 32)
        assert torch.equal(model(x), reference(x))


def test_fused_convolutions_that_do_not_match_leave_the_folded_model(monkeypatch):
    fuse = optimize._Rewrite.fuse_pointwise

    def without_the_relu(rewrite):  # a fusion gone wrong: the first fused conv drops its relu
        done = fuse(rewrite)
        first = next(n for n in rewrite.graph.nodes if n.target is torch.ops.mkldnn._convolution_pointwise.default)
        first.args = (*first.args[:7], "none", *first.args[8:])
        return done

    monkeypatch.setattr(optimize._Rewrite, "fuse_pointwise", without_the_relu)
    reference = trained_like(ResNetMini())
    model, example = module_and_example(program(reference))
    done = optimize.for_inference(model, example, "cpu")
    assert done.applied == ["fold_conv_bn", "channels_last"]
    assert "(fuse_conv_pointwise) did not match" in done.skipped
    assert not any(str(t).startswith("mkldnn.") for t in targets(model))
    assert not BATCH_NORMS & set(targets(model))
    with torch.inference_mode():
        x = torch.randn(5, 3, 32, 32)
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)


def test_a_rewrite_that_raises_serves_the_model_as_the_stage_before_left_it(monkeypatch):
    def breaks(rewrite):
        raise RuntimeError("a graph this rewrite did not foresee")

    monkeypatch.setattr(optimize._Rewrite, "fuse_pointwise", breaks)
    model, example = module_and_example(program(trained_like(ResNetMini())))
    done = optimize.for_inference(model, example, "cpu")
    assert done.applied == ["fold_conv_bn", "channels_last"] and "did not foresee" in done.skipped
    monkeypatch.setattr(optimize._Rewrite, "layout", breaks)
    model, example = module_and_example(program(trained_like(ResNetMini())))
    graph = str(model.graph)
    done = optimize.for_inference(model, example, "cpu")
    assert done.applied == [] and "a rewrite failed" in done.skipped and str(model.graph) == graph


class BroadcastResidual(torch.nn.Module):
    """relu(conv(x) + a per-channel bias): an add oneDNN's binary post-op does not broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.shift = torch.nn.Parameter(torch.randn(1, 4, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + self.shift)


def test_only_exact_patterns_fuse():
    reference = BroadcastResidual().eval()
    model, example = module_and_example(program(reference))
    done = optimize.for_inference(model, example, "cpu")
    assert done.applied == ["channels_last"] and done.skipped is None
    assert aten.add.Tensor in targets(model) and aten.relu.default in targets(model)
    with torch.inference_mode():
        x = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)


def test_models_are_left_alone_where_no_rewrite_is_checked_or_wanted():
    model, example = module_and_example(program(trained_like(ResNetMini())))
    graph = str(model.graph)
    assert "cuda:0" in optimize.for_inference(model, example, "cuda:0").skipped
    assert "no example input" in optimize.for_inference(model, None, "cpu").skipped
    assert "--no-optimize" in optimize.for_inference(model, example, "cpu", enabled=False).skipped
    wrong = (torch.randn(2, 4, 32, 32),)  # four channels where the model takes three
    assert "fails on the model as loaded" in optimize.for_inference(model, wrong, "cpu").skipped
    assert str(model.graph) == graph
    assert not [name for name, _ in model.named_buffers() if name.startswith(optimize.ATTR_PREFIX)]
    linear = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    lm, lx = module_and_example(linear)
    assert optimize.for_inference(lm, lx, "cpu").skipped == "nothing to rewrite (no convolution)"
    scripted = torch.jit.trace(torch.nn.Linear(4, 4).eval(), torch.randn(2, 4))
    assert optimize.for_inference(scripted, (torch.randn(2, 4),), "cpu").skipped == "not a torch.export program"


@pytest.mark.parametrize("enabled", [True, False], ids=["default", "no-optimize"])
def test_the_worker_rewrites_the_model_it_loads_and_says_so(tmp_path, enabled):
    reference = trained_like(ResNetMini())
    store = ModelStore(tmp_path / "store")
    digest = store.put(export_program(reference, torch.randn(1, 3, 32, 32))).digest  # as an instance uploads it
    mgr = GPUManager(cpu_units(1, memory_mb=64), store, optimize=enabled)
    try:
        x = torch.randn(3, 3, 32, 32)
        result = mgr.run(digest, "cpu-0", encode(x))
        info = mgr.workers[(digest, "cpu-0")].info
        with torch.inference_mode():
            torch.testing.assert_close(decode(result.payload), reference(x), rtol=1e-4, atol=1e-5)
        if enabled:
            assert info.optimized == ("fold_conv_bn", "channels_last", "fuse_conv_pointwise")
            assert info.optimize_skipped is None
            assert info.optimize_s > 0 and result.load_split["optimize"] == info.optimize_s
        else:
            assert info.optimized == () and "--no-optimize" in info.optimize_skipped
    finally:
        mgr.close()
