"""`faas-gpu up` profiles what the autoscaler will predict: a model several functions name is
profiled once (issue 45: the keep-alive replay deploys one model under eight functions; each was
profiled again, and the first re-profile a busy machine refused failed the whole `up`)."""

from __future__ import annotations

import yaml

import faas_gpu.cli.up as up
from faas_gpu.contract import env
from faas_gpu.stack import load_stack


def test_a_model_named_by_several_functions_is_profiled_once(monkeypatch, tmp_path):
    monkeypatch.setenv(env.HOME.name, str(tmp_path / "home"))
    functions = {
        name: {
            "lang": "python3-gpu",
            "handler": "./fn",
            "image": f"x/{name}:latest",
            "annotations": {
                "com.faas-gpu.model": model,
                "com.faas-gpu.model-source": "model.py:make",
                "com.faas-gpu.input-shape": "8",
                "com.faas-gpu.slo-ms": "1000",
            },
        }
        for name, model in (("a", "shared"), ("b", "shared"), ("c", "shared"), ("d", "own"))
    }
    (tmp_path / "fn").mkdir()
    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump({"version": 1.0, "provider": {"name": "openfaas"}, "functions": functions}))
    started: list[list[str]] = []  # the profiler runs in the background, as its own process
    monkeypatch.setattr(up.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    up._profile_missing(path, load_stack(path))
    assert len(started) == 1  # one profiler for all of them
    argv = started[0]
    names = argv[argv.index(str(path)) + 1 : argv.index("--repeat")]
    assert names == ["a", "d"]  # one per model, by the first function naming it
