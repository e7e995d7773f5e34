"""`faas-gpu up --callback-allow ... --callback-timeout ...` reaches the stack's own flags, which
`faas-gpu serve` reads (with their environment defaults) and checks at start."""

from __future__ import annotations

import pytest

from faas_gpu.cli import up
from provider.server import parse_args


def test_up_passes_the_callback_options_to_the_stack(tmp_path, monkeypatch):
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    started: list = []
    monkeypatch.setattr(up, "start_stack", lambda home, daemons: started.extend(daemons) or {"faas-gpu": 1})
    monkeypatch.setattr(up.running, "record_stack", lambda *a: tmp_path / "record")
    argv = ["--no-deploy", "--no-gpu", "--callback-allow", "127.0.0.1", "--callback-allow", "hooks.internal,10.0.0.0/8",
            "--callback-timeout", "4s"]  # fmt: skip
    assert up.main(argv) == 0
    [stack] = [d for d in started if d.name == "faas-gpu"]
    args = list(stack.args)
    assert [args[i + 1] for i, a in enumerate(args) if a == "--callback-allow"] == [
        "127.0.0.1",
        "hooks.internal,10.0.0.0/8",
    ]
    assert args[args.index("--callback-timeout") + 1] == "4s"
    cfg = parse_args(args)  # what the stack makes of them
    assert cfg.callback_allow == ("127.0.0.1", "hooks.internal,10.0.0.0/8") and cfg.callback_timeout_s == 4.0


def test_serve_reads_the_callback_options_from_the_environment_and_refuses_bad_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path))
    monkeypatch.setenv("FAAS_GPU_CALLBACK_ALLOW", "192.168.5.0/24, receiver.lan")
    monkeypatch.setenv("FAAS_GPU_CALLBACK_TIMEOUT", "2500ms")
    cfg = parse_args([])
    assert cfg.callback_allow == ("192.168.5.0/24", "receiver.lan") and cfg.callback_timeout_s == 2.5
    assert parse_args(["--callback-allow", "127.0.0.1"]).callback_allow == ("127.0.0.1",)  # the flag wins
    monkeypatch.delenv("FAAS_GPU_CALLBACK_ALLOW")
    monkeypatch.delenv("FAAS_GPU_CALLBACK_TIMEOUT")
    cfg = parse_args([])
    assert cfg.callback_allow == () and cfg.callback_timeout_s == 10.0
    for argv in (["--callback-allow", "not a host"], ["--callback-timeout", "soon"], ["--callback-timeout", "0"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert "--callback-" in capsys.readouterr().err
