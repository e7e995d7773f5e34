"""Which placement policy the scheduler daemon runs (issue 45): `--policy` / `--o3-limit`, or
`FAAS_GPU_PLACEMENT` / `FAAS_GPU_O3_LIMIT` from the contract, built by the policies' own factory,
and said in `/v1/status` so that a replay against a running stack knows what it compares."""

from __future__ import annotations

import pytest
import requests

from faas_gpu.contract import env
from faas_gpu.credentials import ensure_token
from scheduler.daemon import parse_args
from tests.daemon_process import Daemon


def test_the_flag_wins_over_the_environment_and_the_environment_over_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv(env.PLACEMENT.name, raising=False)
    monkeypatch.delenv(env.O3_LIMIT.name, raising=False)
    a = parse_args(["--home", str(tmp_path)])
    assert (a.policy, a.o3_limit) == ("lalb_o3", 25)
    monkeypatch.setenv(env.PLACEMENT.name, "LB")
    monkeypatch.setenv(env.O3_LIMIT.name, "4")
    a = parse_args(["--home", str(tmp_path)])
    assert (a.policy, a.o3_limit) == ("lb", 4)
    a = parse_args(["--home", str(tmp_path), "--policy", "lalb-o3", "--o3-limit", "0"])
    assert (a.policy, a.o3_limit) == ("lalb_o3", 0)


@pytest.mark.parametrize(
    ("argv", "environ", "said"),
    [
        (["--policy", "fifo"], {}, "argument --policy: expected one of lb, lalb, lalb_o3, got 'fifo'"),
        (["--o3-limit", "-5"], {}, "argument --o3-limit: must be >= 0, got -5"),
        ([], {"FAAS_GPU_PLACEMENT": "random"}, "$FAAS_GPU_PLACEMENT / $FAAS_GPU_O3_LIMIT: expected one of"),
    ],
)
def test_a_bad_policy_is_a_clear_error(monkeypatch, tmp_path, capsys, argv, environ, said):
    for k in (env.PLACEMENT.name, env.O3_LIMIT.name):
        monkeypatch.delenv(k, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--home", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err


def test_the_running_scheduler_says_its_policy(monkeypatch, tmp_path):
    monkeypatch.setenv(env.PLACEMENT.name, "lb")
    auth = {"Authorization": f"Bearer {ensure_token(tmp_path / 'secrets')}"}
    sched = Daemon("scheduler", tmp_path)
    try:
        status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=10).json()
        assert (status["policy"], status["o3_limit"]) == ("lb", 0)
    finally:
        sched.kill()
    monkeypatch.delenv(env.PLACEMENT.name)
    sched = Daemon("scheduler", tmp_path, "--policy", "lalb_o3", "--o3-limit", "7")
    try:
        status = requests.get(f"{sched.url}/v1/status", headers=auth, timeout=10).json()
        assert (status["policy"], status["o3_limit"]) == ("lalb_o3", 7)
    finally:
        sched.kill()
