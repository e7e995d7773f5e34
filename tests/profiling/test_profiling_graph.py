"""The operator graph: INFless's combination rule (§3.3), tracing, and operator signatures."""

import pytest
import torch
from torch import nn

from faas_gpu.profiling.examples import TextCNN
from faas_gpu.profiling.graph import OpGraph, OpNode, TraceError, trace_model
from faas_gpu.profiling.operators import input_maker


def graph(edges: dict[str, tuple[str, ...]], concurrent: bool = True) -> OpGraph:
    """Nodes named after their signature, in the dict's (topological) order."""
    return OpGraph([OpNode(n, n, n, ins) for n, ins in edges.items()], concurrent)


def test_a_chain_adds_its_operators():
    g = graph({"a": (), "b": ("a",), "c": ("b",)})
    assert g.combine({"a": 1.0, "b": 2.0, "c": 4.0}) == 7.0


def test_parallel_branches_take_the_slowest():
    g = graph({"src": (), "left": ("src",), "right": ("src",), "join": ("left", "right")})
    t = {"src": 1.0, "left": 5.0, "right": 3.0, "join": 2.0}
    assert g.combine(t) == 1.0 + 5.0 + 2.0
    t["right"] = 9.0
    assert g.combine(t) == 1.0 + 9.0 + 2.0


def test_a_branch_that_is_itself_a_chain_adds_before_the_max():
    # src -> (l1 -> l2) | r -> join: the left chain 2+2 beats the right 3
    g = graph({"src": (), "l1": ("src",), "l2": ("l1",), "r": ("src",), "join": ("l2", "r")})
    assert g.combine({"src": 1.0, "l1": 2.0, "l2": 2.0, "r": 3.0, "join": 1.0}) == 1.0 + 4.0 + 1.0


def test_nested_fork_join():
    # a fork inside one branch of an outer fork
    g = graph(
        {
            "src": (),
            "x": ("src",),
            "x1": ("x",),
            "x2": ("x",),
            "xj": ("x1", "x2"),
            "y": ("src",),
            "join": ("xj", "y"),
        }
    )
    t = {"src": 1.0, "x": 1.0, "x1": 4.0, "x2": 6.0, "xj": 1.0, "y": 7.0, "join": 1.0}
    assert g.combine(t) == 1.0 + (1.0 + 6.0 + 1.0) + 1.0  # inner max 6, then 8 beats y's 7
    t["y"] = 9.0
    assert g.combine(t) == 1.0 + 9.0 + 1.0


def test_a_serial_executor_pays_every_branch():
    g = graph({"src": (), "left": ("src",), "right": ("src",), "join": ("left", "right")}, concurrent=False)
    t = {"src": 1.0, "left": 5.0, "right": 3.0, "join": 2.0}
    assert g.combine(t) == 11.0
    assert g.combine(t, concurrent=True) == 8.0


def test_shared_signatures_weigh_each_use():
    g = OpGraph([OpNode("a", "conv", "conv"), OpNode("b", "conv", "conv", ("a",))], True)
    assert g.combine({"conv": 2.5}) == 5.0


def test_graph_json_round_trip_and_validation():
    g = graph({"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")})
    back = OpGraph.from_json(g.to_json())
    assert back == g and back.edges == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    with pytest.raises(ValueError, match="not an earlier node"):
        OpGraph([OpNode("b", "x", "x", ("a",)), OpNode("a", "x", "x")])


def test_textcnn_traces_as_a_fork_and_a_join():
    _, g = trace_model(TextCNN().eval(), input_maker((16,), "int64"))
    by_name = {n.name: n for n in g.nodes}
    convs = [n for n in g.nodes if n.op == "Conv1d"]
    assert len(convs) == 3 and len({c.inputs for c in convs}) == 1  # all read the same tensor
    cat = next(n for n in g.nodes if n.op == "cat")
    assert len(cat.inputs) == 3
    assert by_name[convs[0].inputs[0]].op == "transpose"
    # the kernel size is part of the signature: three different operators
    assert len({c.signature for c in convs}) == 3


def test_signatures_leave_the_batch_out_wherever_it_is():
    class SeqFirst(nn.Module):  # batch in dimension 1, and a reshape that mixes it in
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 8)
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            y, _ = self.lstm(x.transpose(0, 1))
            return self.out(y.reshape(-1, 8))

    _, g = trace_model(SeqFirst().eval(), input_maker((5, 8)))
    sigs = {n.op: n.signature for n in g.nodes}
    assert "float32[5,*,8]" in sigs["LSTM"]
    assert "float32[*,8]" in sigs["Linear"]
    assert sigs["transpose"] == "Tensor.transpose(float32[*,5,8],0,1)"
    assert sigs["reshape"] == "Tensor.reshape(float32[5,*,8],-1,8)"


def test_two_models_with_the_same_layer_share_its_signature():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    b = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4), nn.Softmax(dim=1)).eval()
    _, ga = trace_model(a, input_maker((16,)))
    _, gb = trace_model(b, input_maker((16,)))
    shared = ga.signatures & gb.signatures
    assert len(shared) == 2  # both Linear layers; ReLU vs Tanh differ
    c = nn.Sequential(nn.Linear(16, 64)).eval()  # same type, other shape: another operator
    _, gc = trace_model(c, input_maker((16,)))
    assert not gc.signatures & ga.signatures


def test_torch_export_takes_over_when_symbolic_tracing_fails():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x):
            if x.shape[1] > 4:  # control flow on a shape: torch.fx cannot follow it
                x = x * 2
            return torch.relu(self.lin(x)).view(x.size(0), -1)

    gm, g = trace_model(Branchy().eval(), input_maker((8,)))
    assert any("aten.linear" in s for s in g.signatures)
    assert all("[2," not in s and "[3," not in s for s in g.signatures)
    out = gm(torch.randn(7, 8))  # the batch stayed dynamic
    assert out.shape == (7, 4)


def test_a_model_that_rejects_the_input_shape_is_a_trace_error():
    with pytest.raises(TraceError, match="input of shape"):
        trace_model(nn.Sequential(nn.Linear(8, 4)).eval(), input_maker((5,)))
