"""What batch a model accepts, read from its archive as data (issue 43, `faas_gpu.models.batch_limits`).

Real programs, exported here: the batch each way of exporting gives, as the store keeps it and
the upload answers it; a garbled or hostile batch field is a clear refusal naming the field.
"""

from __future__ import annotations

import io

import pytest
import torch

from faas_gpu.contract.errors import ArtifactError, BatchRefused
from faas_gpu.models import ModelStore
from faas_gpu.models.batch_limits import BatchLimits, check_batch, tighter
from tests.malicious import edit_json, tampered, torchscript

MODEL = "models/model.json"


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def _program(example: torch.Tensor, dynamic_shapes=None) -> bytes:
    buf = io.BytesIO()
    torch.export.save(torch.export.export(_Linear().eval(), (example,), dynamic_shapes=dynamic_shapes), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def static_one() -> bytes:
    return _program(torch.randn(1, 4))


@pytest.mark.parametrize(
    ("what", "make", "kind", "low", "high", "max_rows", "text"),
    [
        ("one example input", lambda: _program(torch.randn(1, 4)), "static", 1, 1, 1, "static 1"),
        ("an example of 3", lambda: _program(torch.randn(3, 4)), "static", 3, 3, 1, "static 3"),
        (
            "a Dim range",
            lambda: _program(torch.randn(2, 4), ({0: torch.export.Dim("b", min=1, max=64)},)),
            "dynamic",
            1,
            64,
            64,
            "dynamic 1..64",
        ),
        (
            "Dim.AUTO (torch says min 2, runs batch 1)",
            lambda: _program(torch.randn(2, 4), ({0: torch.export.Dim.AUTO},)),
            "dynamic",
            1,
            None,
            None,
            "dynamic 1..",
        ),
        (
            "an unbounded Dim",
            lambda: _program(torch.randn(2, 4), ({0: torch.export.Dim("b")},)),
            "dynamic",
            1,
            None,
            None,
            "dynamic 1..",
        ),
        (
            "a Dim range from 4",
            lambda: _program(torch.randn(5, 4), ({0: torch.export.Dim("b", min=4, max=8)},)),
            "dynamic",
            4,
            8,
            8,
            "dynamic 4..8",
        ),
    ],
)
def test_the_store_reads_the_batch_a_program_accepts(tmp_path, what, make, kind, low, high, max_rows, text):
    a = ModelStore(tmp_path).put(make())
    assert (a.batch.kind, a.batch.low, a.batch.high, a.batch.max_rows) == (kind, low, high, max_rows), what
    assert a.batch.text() == text
    # read again from the kept file (a restarted daemon's store): the same facts
    assert ModelStore(tmp_path).get(a.digest).batch == a.batch


@pytest.mark.parametrize(
    ("example", "dynamic_shapes"),
    [
        (1, None),
        (3, None),
        (2, ({0: torch.export.Dim("b", min=1, max=8)},)),
        (2, ({0: torch.export.Dim.AUTO},)),
        (5, ({0: torch.export.Dim("b", min=4, max=8)},)),
    ],
)
def test_the_batches_refused_are_exactly_those_torch_refuses(tmp_path, example, dynamic_shapes):
    """`check_batch` is what the scheduler and the GPU Manager answer before torch would: it must
    refuse no batch the model runs and pass none its input check refuses (as the worker loads it,
    guards off)."""
    program = _program(torch.randn(example, 4), dynamic_shapes)
    limits = ModelStore(tmp_path).put(program).batch
    module = torch.export.load(io.BytesIO(program)).module(check_guards=False)
    for rows in (0, 1, 2, 3, 4, 5, 8, 9):
        try:
            module(torch.randn(rows, 4))
            torch_refuses = False
        except RuntimeError as exc:
            assert "Expected input at *args[0].shape[0]" in str(exc), exc
            torch_refuses = True
        try:
            check_batch(limits, [rows, 4], "m")
            refused = False
        except BatchRefused as exc:
            refused = True
            assert str(exc) == f"shape[0]: a batch of {rows} rows; m accepts batch {limits.text()}"
        assert refused == torch_refuses, (limits.text(), rows)


def test_a_batch_of_a_model_whose_batch_is_unknown_is_left_to_the_model():
    for limits in (None, BatchLimits("unknown", why="TorchScript declares no batch")):
        check_batch(limits, [1000, 4])
        check_batch(limits, [])
    with pytest.raises(BatchRefused, match=r"^shape: a scalar"):
        check_batch(BatchLimits("static", 1, 1), [])


def test_torchscript_declares_no_batch_so_its_calls_run_one_at_a_time(tmp_path):
    a = ModelStore(tmp_path).put(torchscript(torch.nn.Linear(2, 2)))
    assert a.batch.kind == "unknown" and a.batch.max_rows == 1
    assert "TorchScript" in a.batch.text() and "one at a time" in a.batch.text()


def test_an_instance_batch_size_is_held_within_the_models():
    assert tighter(8, BatchLimits("static", 1, 1)) == 1
    assert tighter(8, BatchLimits("dynamic", 1, 3)) == 3
    assert tighter(8, BatchLimits("dynamic", 1, None)) == 8
    assert tighter(8, None) == 8


def test_the_upload_answers_batch_reads_back_and_garbage_is_unknown():
    for limits in (BatchLimits("static", 1, 1), BatchLimits("dynamic", 1, 64), BatchLimits("dynamic", 2, None)):
        assert BatchLimits.from_json(limits.to_json()) == limits
    for garbage in (None, "static 1", {"kind": "static", "min": "1"}, {"kind": "dynamic", "min": 5, "max": 2}, {}):
        assert BatchLimits.from_json(garbage).max_rows == 1


def _ranges(d: dict) -> dict:
    return d["range_constraints"]


def _x_sizes(d: dict) -> list:
    return d["graph_module"]["graph"]["tensor_values"]["x"]["sizes"]


@pytest.mark.parametrize(
    ("what", "change", "field"),
    [
        ("a batch size that is text", lambda d: _x_sizes(d)[0].update(as_int="1; rm -rf /"), r"sizes\[0\]\.as_int"),
        ("a batch size of 0", lambda d: _x_sizes(d)[0].update(as_int=0), r"sizes\[0\]\.as_int"),
        ("a batch size of true", lambda d: _x_sizes(d)[0].update(as_int=True), r"sizes\[0\]\.as_int"),
        ("a batch size of 2**80", lambda d: _x_sizes(d)[0].update(as_int=2**80), r"sizes\[0\]\.as_int"),
        ("a size of neither kind", lambda d: _x_sizes(d).__setitem__(0, {"as_float": 1.0}), r"sizes\[0\]"),
        (
            "sizes that are not a list",
            lambda d: d["graph_module"]["graph"]["tensor_values"]["x"].update(sizes=7),
            "sizes",
        ),
        ("no tensor for the input", lambda d: d["graph_module"]["graph"]["tensor_values"].pop("x"), "tensor_values.x"),
        ("input specs not a list", lambda d: d["graph_module"]["signature"].update(input_specs={}), "input_specs"),
    ],
)
def test_a_garbled_static_batch_is_refused_naming_the_field(tmp_path, static_one, what, change, field):
    garbled = tampered(static_one, lambda e: edit_json(e, MODEL, change))
    with pytest.raises(ArtifactError, match=field) as err:
        ModelStore(tmp_path).put(garbled)
    assert "models/model.json" in str(err.value), what
    assert [p for p in tmp_path.iterdir()] == [], what  # nothing kept


@pytest.fixture(scope="module")
def ranged() -> bytes:
    return _program(torch.randn(2, 4), ({0: torch.export.Dim("b", min=1, max=64)},))


def _symbol(d: dict) -> str:
    return next(iter(_ranges(d)))


@pytest.mark.parametrize(
    ("what", "change", "field"),
    [
        ("a max below the min", lambda d: _ranges(d)[_symbol(d)].update(min_val=9, max_val=3), "max_val"),
        ("a max that is text", lambda d: _ranges(d)[_symbol(d)].update(max_val="oo"), "max_val"),
        ("a negative min", lambda d: _ranges(d)[_symbol(d)].update(min_val=-1), "min_val"),
        ("a min that is a list", lambda d: _ranges(d)[_symbol(d)].update(min_val=[1]), "min_val"),
        ("no max", lambda d: _ranges(d)[_symbol(d)].pop("max_val"), "max_val is missing"),
        ("no range for the symbol", lambda d: _ranges(d).clear(), r"range_constraints\.s\d+ is missing"),
        ("a range that is a number", lambda d: _ranges(d).update({_symbol(d): 5}), "is not an object"),
        (
            "an expression that does not parse",
            lambda d: _x_sizes(d)[0]["as_expr"].update(expr_str="Symbol('s77'"),
            "shape expression .* does not parse",  # the code checks refuse it first
        ),
        ("an expression that is a number", lambda d: _x_sizes(d)[0]["as_expr"].update(expr_str=5), "shape expression"),
    ],
)
def test_a_garbled_batch_range_is_refused_naming_the_field(tmp_path, ranged, what, change, field):
    with pytest.raises(ArtifactError, match=field) as err:
        ModelStore(tmp_path).put(tampered(ranged, lambda e: edit_json(e, MODEL, change)))
    assert "models/model.json" in str(err.value) or "shape expression" in str(err.value), what


def test_a_batch_that_is_an_expression_of_a_symbol_is_unknown(tmp_path, ranged):
    doubled = tampered(
        ranged,
        lambda e: edit_json(
            e, MODEL, lambda d: _x_sizes(d)[0]["as_expr"].update(expr_str=f"2*Symbol('{_symbol(d)}', integer=True)")
        ),
    )
    limits = ModelStore(tmp_path).put(doubled).batch
    assert limits.kind == "unknown" and limits.max_rows == 1


def test_a_garbled_batch_at_the_gpu_managers_upload_is_a_400_naming_the_field(tmp_path, ranged):
    from gpu_manager.api import create_app
    from gpu_manager.discovery import cpu_units
    from gpu_manager.manager import GPUManager

    client = create_app(GPUManager(cpu_units(1, 0.1), ModelStore(tmp_path)), "t").test_client()
    auth = {"Authorization": "Bearer t"}
    r = client.put("/v1/models", data=ranged, headers=auth)
    assert r.status_code == 201 and r.get_json()["batch"] == {
        "kind": "dynamic",
        "min": 1,
        "max": 64,
        "text": "dynamic 1..64",
    }
    garbled = tampered(ranged, lambda e: edit_json(e, MODEL, lambda d: _ranges(d)[_symbol(d)].update(max_val="x")))
    r = client.put("/v1/models", data=garbled, headers=auth)
    assert r.status_code == 400 and b"max_val" in r.data


@pytest.mark.parametrize("expr", ["-" * 9990 + "s0", "~" * 9000 + "s0", "+" * 9990 + "1"])
def test_a_shape_expression_too_deep_for_the_parser_is_a_400_not_a_500(tmp_path, ranged, expr):
    """Python's parser answers an expression nested past its stack with MemoryError, not a
    SyntaxError: a function's token uploading one got a 500 from the upload (issue 41)."""
    from gpu_manager.api import create_app
    from gpu_manager.discovery import cpu_units
    from gpu_manager.manager import GPUManager

    deep = tampered(ranged, lambda e: edit_json(e, MODEL, lambda d: _x_sizes(d)[0]["as_expr"].update(expr_str=expr)))
    with pytest.raises(ArtifactError, match="shape expression .* does not parse"):
        ModelStore(tmp_path / "store").put(deep)
    client = create_app(GPUManager(cpu_units(1, 0.1), ModelStore(tmp_path / "api")), "t").test_client()
    r = client.put("/v1/models", data=deep, headers={"Authorization": "Bearer t"})
    assert r.status_code == 400 and b"does not parse" in r.data, r.data[:200]


def test_the_batch_reader_refuses_an_expression_too_deep_for_the_parser():
    """`of_program` on its own (`faas-gpu export` reads the batch of what it sends): the same
    expression is an ArtifactError naming the field, never a MemoryError."""
    from faas_gpu.models.batch_limits import of_program

    program = {
        "graph_module": {
            "signature": {"input_specs": [{"user_input": {"arg": {"as_tensor": {"name": "x"}}}}]},
            "graph": {"tensor_values": {"x": {"sizes": [{"as_expr": {"expr_str": "-" * 9990 + "s0"}}]}}},
        },
        "range_constraints": {},
    }
    with pytest.raises(ArtifactError, match="expr_str does not parse"):
        of_program(program)
