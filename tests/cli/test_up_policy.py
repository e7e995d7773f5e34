"""`faas-gpu up --policy / --o3-limit`: the schedulers it starts are told the placement policy
(issue 45: a replay switches LB, LALB and LALB-O3 on the live stack through the CLI)."""

from __future__ import annotations

import pytest

import faas_gpu.cli.up as up
from faas_gpu.contract import env


class Started(Exception):
    pass


def daemons_of(monkeypatch, tmp_path, *argv: str) -> list:
    seen = []

    def start_stack(home, daemons):
        seen.extend(daemons)
        raise Started

    monkeypatch.setenv(env.HOME.name, str(tmp_path))
    monkeypatch.setattr(up, "start_stack", start_stack)
    with pytest.raises(Started):
        up.main(["--no-deploy", "--backend", "cpu", *argv])
    return [d for d in seen if d.module == "scheduler"]


def test_every_scheduler_replica_gets_the_policy_and_skip_limit(monkeypatch, tmp_path):
    for k in (env.PLACEMENT.name, env.O3_LIMIT.name):
        monkeypatch.delenv(k, raising=False)
    schedulers = daemons_of(monkeypatch, tmp_path, "--policy", "lb", "--schedulers", "2")
    assert len(schedulers) == 2
    for d in schedulers:
        args = list(d.args)
        assert args[args.index("--policy") + 1] == "lb" and args[args.index("--o3-limit") + 1] == "25"
    monkeypatch.setenv(env.PLACEMENT.name, "lalb_o3")
    monkeypatch.setenv(env.O3_LIMIT.name, "9")
    (only,) = daemons_of(monkeypatch, tmp_path)
    assert list(only.args)[2:6] == ["--policy", "lalb_o3", "--o3-limit", "9"]


def test_a_bad_policy_is_refused_before_anything_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(up, "start_stack", lambda *a: pytest.fail("started"))
    with pytest.raises(SystemExit) as exit_:
        up.main(["--no-deploy", "--policy", "round-robin"])
    assert exit_.value.code == 2
    assert "argument --policy: expected one of lb, lalb, lalb_o3, got 'round-robin'" in capsys.readouterr().err
