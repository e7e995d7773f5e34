"""The GPU Manager refuses artifacts whose loading or running would run the uploader's code.

Static checks (`faas_gpu.models.safe_formats`), before torch opens the file: each tampered program
below was accepted by the store before (anything with a `models/` folder was "export").
"""

from __future__ import annotations

import pytest

from faas_gpu.models import ArtifactError, ModelStore
from tests.malicious import (
    SavesAFileOnLoad,
    edit_json,
    exported_linear,
    hostile_program,
    hostile_torchscript,
    malicious_pickle,
    tampered,
    torchscript,
)

MODEL = "models/model.json"


@pytest.fixture(scope="module")
def program() -> bytes:
    return exported_linear()


def _first_node(doc: dict) -> dict:
    return doc["graph_module"]["graph"]["nodes"][0]


def test_a_genuine_export_and_torchscript_are_accepted(tmp_path, program):
    import torch

    store = ModelStore(tmp_path)
    assert store.put(program).format == "export"
    assert store.put(torchscript(torch.nn.Linear(2, 2))).format == "torchscript"


def test_a_malicious_pickle_is_refused_at_upload(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ArtifactError, match="pickle is refused"):
        ModelStore(tmp_path / "store").put(malicious_pickle(marker))
    assert not marker.exists()


@pytest.mark.parametrize(
    "what, edit, message",
    [
        (
            "a node target that resolves to os.system",
            lambda e: edit_json(e, MODEL, lambda d: _first_node(d).update(target="torch.os.system")),
            "operator 'torch.os.system' is not allowed",
        ),
        (
            "a file-reading operator",
            lambda e: edit_json(e, MODEL, lambda d: _first_node(d).update(target="torch.ops.aten.from_file.default")),
            "is not allowed",
        ),
        (
            "oneDNN's fused convolution, which only the worker's own rewrite may insert",
            lambda e: edit_json(
                e, MODEL, lambda d: _first_node(d).update(target="torch.ops.mkldnn._convolution_pointwise.default")
            ),
            "is not allowed",
        ),
        (
            "a shape expression that sympify would eval",
            lambda e: edit_json(
                e,
                MODEL,
                lambda d: d["graph_module"]["graph"]["tensor_values"]["input"]["sizes"][0]["as_expr"].update(
                    expr_str="__import__('os').system('touch /tmp/pwned')"
                ),
            ),
            "shape expression",
        ),
        (
            "a range constraint that sympify would eval",
            lambda e: edit_json(e, MODEL, lambda d: d.__setitem__("range_constraints", {"open('/x','w')": {}})),
            "shape expression",
        ),
        (
            "a parameter name that FX would paste into code",
            lambda e: edit_json(
                e,
                MODEL,
                lambda d: d["graph_module"]["signature"]["input_specs"][0]["parameter"].update(
                    parameter_name='w")+exec("import os")+("'
                ),
            ),
            "not a dotted name",
        ),
        (
            "a forward argument name that FX would paste into code",
            lambda e: edit_json(
                e,
                MODEL,
                lambda d: d["graph_module"]["module_call_graph"][0]["signature"].update(
                    forward_arg_names=["x=exec('1')"]
                ),
            ),
            "not an identifier",
        ),
        (
            "a pickled weight",
            lambda e: edit_json(
                e, "data/weights/model_weights_config.json", lambda d: d["config"]["weight"].update(use_pickle=True)
            ),
            "is pickled",
        ),
        (
            "an opaque constant (pickle.loads)",
            lambda e: edit_json(
                e,
                "data/constants/model_constants_config.json",
                lambda d: d["config"].update(c={"path_name": "opaque_0", "use_pickle": False}),
            ),
            "custom or opaque object",
        ),
        (
            "guard code that .module() would exec",
            lambda e: edit_json(e, MODEL, lambda d: d.update(guards_code=["__import__('os').system('true') or 1"])),
            "guards_code is Python",
        ),
        (
            "AOTInductor native code",
            lambda e: e.update({"data/aotinductor/model/model.so": b"\x7fELF"}),
            "AOTInductor code is refused",
        ),
    ],
)
def test_a_tampered_export_program_is_refused_before_torch_opens_it(tmp_path, program, what, edit, message):
    with pytest.raises(ArtifactError, match=message):
        ModelStore(tmp_path).put(tampered(program, edit))
    assert [p for p in tmp_path.iterdir()] == [], what


def test_torchscript_that_runs_code_at_load_time_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ArtifactError, match="__setstate__"):
        ModelStore(tmp_path / "store").put(torchscript(SavesAFileOnLoad(str(marker))))
    assert not marker.exists()


def test_a_loaded_graph_calling_the_fused_convolutions_is_refused_unless_the_worker_rewrote_it():
    import torch

    from faas_gpu.models.safe_formats import check_graph
    from gpu_manager.optimize import fused_ops

    def calling(*more):
        graph = torch.fx.Graph()
        x, w = graph.placeholder("x"), graph.placeholder("w")
        conv = torch.ops.mkldnn._convolution_pointwise.default
        out = graph.call_function(conv, (x, w, None, [0, 0], [1, 1], [1, 1], 1, "relu", [], ""))
        for op, args in more:
            graph.call_function(op, args)
        graph.output(out)
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    with pytest.raises(ArtifactError, match="is not allowed"):
        check_graph(calling())  # as loaded: an artifact may not call oneDNN's operators
    check_graph(calling(), rewritten_with=fused_ops())  # the worker's own rewrite of a checked graph
    with pytest.raises(ArtifactError, match="is not allowed"):  # and nothing else is let through with it
        check_graph(calling((torch.ops.aten.from_file.default, ("/etc/passwd",))), rewritten_with=fused_ops())


# -- issue 41: what is checked is what torch loads ---------------------------------------------------
def test_a_program_whose_hostile_entry_only_torch_reads_is_refused_at_upload(tmp_path, program):
    marker = tmp_path / "pwned"
    with pytest.raises(ArtifactError, match="models/model.json appears twice"):
        ModelStore(tmp_path / "store").put(hostile_program(program, marker))
    assert list((tmp_path / "store").iterdir()) == []
    assert not marker.exists()


def test_torchscript_whose_hidden_setstate_only_torch_reads_is_refused_at_upload(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ArtifactError, match="appears twice"):
        ModelStore(tmp_path / "store").put(hostile_torchscript(marker))
    assert list((tmp_path / "store").iterdir()) == []
    assert not marker.exists()
