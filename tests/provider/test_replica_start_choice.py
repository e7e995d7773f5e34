"""Which replicas the fork server starts and what /system/info says about it (issue 44): isolated
python3-gpu replicas are forked; others, unisolated replicas and FAAS_GPU_FORK_SERVER=off are
exec'd, and the runtime says why. No server is started here (it starts with the first python3-gpu
function planned)."""

from __future__ import annotations

import sys
from pathlib import Path

from faas_gpu.imagestore import ImageStore
from provider.logs import LogStore
from provider.runtime.forkserver import forkable
from provider.runtime.launch import LaunchSpec
from provider.runtime.local import LocalRuntime
from provider.store import SecretStore


def runtime(tmp_path: Path, **kwargs) -> LocalRuntime:
    home = tmp_path / "home"
    home.mkdir(mode=0o700, parents=True)
    return LocalRuntime(home, ImageStore(home / "images"), SecretStore(home / "s"), LogStore(home / "l"), **kwargs)


def python3_gpu(tmp_path: Path, **env: str) -> LaunchSpec:
    context = tmp_path / "context"
    (context / "faas_gpu_watchdog").mkdir(parents=True, exist_ok=True)
    (context / "index.py").write_text("")
    argv = [sys.executable, str(context / "fwatchdog.py")]
    env = {"mode": "inproc", "fprocess": "python index.py", **env}
    return LaunchSpec(argv, context, env, False, 30.0, "d", image=tmp_path)


def test_only_python3_gpu_replicas_in_mode_inproc_are_forked(tmp_path):
    assert forkable(python3_gpu(tmp_path)) is None
    assert "inproc" in forkable(python3_gpu(tmp_path, mode="http"))
    assert "inproc" in forkable(python3_gpu(tmp_path, fprocess="python other.py"))
    other = python3_gpu(tmp_path)
    other.argv = ["/usr/bin/node", other.argv[1]]
    assert "another interpreter" in forkable(other)
    classic = LaunchSpec([sys.executable, "fwatchdog.py"], None, {"mode": "classic"}, False, 30.0, "d")
    assert forkable(classic) == "no image"


def test_off_says_exec_and_why(tmp_path):
    rt = runtime(tmp_path, isolation="off", fork_server=True)
    try:
        said = rt.isolation().describe()["replicaStart"]
        assert said["method"] == "exec" and "not isolated" in said["reason"]
        assert rt.fork_server is None
    finally:
        rt.close()
    rt = runtime(tmp_path / "2", isolation="off", fork_server=False)
    try:
        assert rt.isolation().describe()["replicaStart"] == {"method": "exec", "reason": "FAAS_GPU_FORK_SERVER=off"}
    finally:
        rt.close()


def test_the_env_var_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("FAAS_GPU_FORK_SERVER", "off")
    rt = runtime(tmp_path, isolation="off")
    try:
        assert rt.isolation().describe()["replicaStart"]["reason"] == "FAAS_GPU_FORK_SERVER=off"
    finally:
        rt.close()
