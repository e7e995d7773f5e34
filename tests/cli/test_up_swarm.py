"""`faas-gpu up --runtime swarm`: the stack's daemons get `--runtime swarm` and the manager's
engine, and each function image is built with the engine and pushed (workers pull it from the
registry its name says); no engine needed, the build and the deploy are recorded."""

from __future__ import annotations

import yaml

from faas_gpu.cli import up


def test_up_runtime_swarm_passes_the_runtime_and_builds_and_pushes(tmp_path, monkeypatch):
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "handler.py").write_text("def handle(event, context):\n    return 'ok'\n")
    fn = {"lang": "python3-gpu", "handler": "./fn", "image": "10.77.0.1:5000/fn:latest"}
    stack = {"version": 1.0, "provider": {"name": "openfaas"}, "functions": {"fn": fn}}
    (tmp_path / "stack.yml").write_text(yaml.safe_dump(stack))
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    started, builds = [], []
    monkeypatch.setattr(up, "start_stack", lambda home, daemons: started.extend(daemons) or {"faas-gpu": 1})
    monkeypatch.setattr(up.running, "record_stack", lambda *a: tmp_path / "record")
    monkeypatch.setattr(up, "credentials", lambda *a: ("admin", "pw"))
    monkeypatch.setattr(up, "docker_build", lambda spec, **kw: builds.append((spec.image, kw)))
    monkeypatch.setattr(up, "deploy_specs", lambda client, specs: [s.name for s in specs])
    monkeypatch.setattr(up, "wait_ready", lambda *a, **kw: True)
    monkeypatch.setattr(up, "_profile_missing", lambda *a: None)
    argv = ["-f", "stack.yml", "--runtime", "swarm", "--docker-host", "unix:///tmp/m.sock", "--bind", "10.77.0.1",
            "--build-arg", "BASE_IMAGE=faas-gpu/base:latest"]  # fmt: skip
    assert up.main(argv) == 0
    [provider] = [d for d in started if d.name == "faas-gpu"]
    assert "--runtime" in provider.args and provider.args[provider.args.index("--runtime") + 1] == "swarm"
    assert provider.args[provider.args.index("--docker-host") + 1] == "unix:///tmp/m.sock"
    # replicas on other nodes reach the scheduler at the bound address, not loopback
    assert provider.args[provider.args.index("--scheduler") + 1] == "http://10.77.0.1:8091"
    [(image, kw)] = builds
    assert image == "10.77.0.1:5000/fn:latest" and kw["push"] is True
    assert kw["docker_host"] == "unix:///tmp/m.sock" and kw["build_args"] == {"BASE_IMAGE": "faas-gpu/base:latest"}


def test_up_passes_each_namespace_to_the_provider(tmp_path, monkeypatch):
    """`faas-gpu up --namespace openfaas-fn --namespace certifier-test`: the provider allows both (the
    certifier's CERTIFIER_NAMESPACES run lists exactly these; the provider's own --namespace)."""
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    started: list = []
    monkeypatch.setattr(up, "start_stack", lambda home, daemons: started.extend(daemons) or {"faas-gpu": 1})
    monkeypatch.setattr(up.running, "record_stack", lambda *a: tmp_path / "record")
    argv = ["--no-deploy", "--no-gpu", "--runtime", "docker",
            "--namespace", "openfaas-fn", "--namespace", "certifier-test"]  # fmt: skip
    assert up.main(argv) == 0
    [provider] = [d for d in started if d.name == "faas-gpu"]
    given = [provider.args[i + 1] for i, a in enumerate(provider.args) if a == "--namespace"]
    assert given == ["openfaas-fn", "certifier-test"]
    started.clear()
    assert up.main(["--no-deploy", "--no-gpu"]) == 0  # none given: the provider's default (openfaas-fn)
    [provider] = [d for d in started if d.name == "faas-gpu"]
    assert "--namespace" not in provider.args
