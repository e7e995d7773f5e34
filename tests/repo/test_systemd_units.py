"""The systemd units for hosts that run the daemons outside containers (deploy/systemd/).

They are what supervises the daemons there (issue 42: whatever starts the stack must bring every
daemon back by itself): each restarts always, whatever the number of kills, runs as the dedicated
user behind the usual walls, and starts its daemon with flags that daemon's own parser takes. Where
systemd is installed, `systemd-analyze verify` reads them as systemd would (an unknown key or a
bad value is a warning it prints, not an error it returns, so any output fails the test).
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from faas_gpu.contract import env as contract_env
from faas_gpu.paths import REPO_ROOT

UNITS = REPO_ROOT / "deploy" / "systemd"
ENV_FILE = UNITS / "faas-gpu.env"
PYTHON = "/opt/faas-gpu/.venv/bin/python"
# unit -> the module it runs, and the module whose parse_args takes its flags
DAEMONS = {
    "faas-gpu-gateway.service": ("provider.server", "provider.server"),
    "faas-gpu-scheduler.service": ("scheduler", "scheduler.daemon"),
    "faas-gpu-gpu-manager.service": ("gpu_manager", "gpu_manager.daemon"),
}
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes",
    "UMask": "0077",
}


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections and keys (a key may repeat: every value kept, in order)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}:{n}: not a key=value line in a section: {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def env_file() -> dict[str, str]:
    out = {}
    for line in ENV_FILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


def test_there_is_a_unit_for_each_daemon_and_nothing_else():
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(DAEMONS)


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_each_unit_restarts_its_daemon_always_as_the_dedicated_user_behind_the_walls(name):
    unit = parse_unit(UNITS / name)
    assert set(unit) == {"Unit", "Service", "Install"}
    assert _one(unit, "Service", "Restart") == "always"
    assert float(_one(unit, "Service", "RestartSec")) <= 2
    assert _one(unit, "Unit", "StartLimitIntervalSec") == "0"  # never "start request repeated too quickly"
    assert _one(unit, "Service", "User") == "faas-gpu" and _one(unit, "Service", "Group") == "faas-gpu"
    assert _one(unit, "Service", "StateDirectory") == "faas-gpu"
    for key, value in HARDENING.items():
        assert _one(unit, "Service", key) == value, (name, key)
    assert _one(unit, "Install", "WantedBy") == "multi-user.target"


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_each_unit_starts_its_daemon_with_flags_its_parser_takes(name, monkeypatch, tmp_path):
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path))
    unit = parse_unit(UNITS / name)
    module, parser_module = DAEMONS[name]
    variables = env_file()
    argv = []
    for word in shlex.split(_one(unit, "Service", "ExecStart")):
        if word.startswith("$"):  # systemd splits an unquoted $VAR into words
            assert word[1:] in variables, f"{name}: {word} is not set in {ENV_FILE.name}"
            argv += variables[word[1:]].split()
        else:
            argv.append(word)
    assert argv[:3] == [PYTHON, "-m", module], argv
    args = argv[3:]
    assert args[args.index("--home") + 1] == "/var/lib/faas-gpu"
    importlib.import_module(parser_module).parse_args(args)  # SystemExit (a test error) when refused
    assert not any(re.search(r"://[^/\s]*:[^/\s]*@", a) for a in args), "a login on a command line"
    known = {v.name for v in vars(contract_env).values() if isinstance(v, contract_env.Var)}
    for assignment in " ".join(unit["Service"].get("Environment", [])).split():
        variable = assignment.split("=", 1)[0]
        assert not variable.startswith("FAAS_GPU_") or variable in known, f"{name}: {variable} is read nowhere"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_reads_the_units_without_a_warning(tmp_path):
    """`systemd-analyze verify` on copies whose interpreter is this one (it checks that the
    executable exists; /opt/faas-gpu is where an operator installs, not where the tests run)."""
    for name in DAEMONS:
        (tmp_path / name).write_text((UNITS / name).read_text().replace(PYTHON, sys.executable))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(tmp_path / n) for n in sorted(DAEMONS))],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


def test_a_broken_unit_is_seen(tmp_path):
    """The check above can fail: a restart rule systemd does not take is said, not returned."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    broken = (UNITS / "faas-gpu-scheduler.service").read_text().replace(PYTHON, sys.executable)
    path = tmp_path / "faas-gpu-broken.service"
    path.write_text(broken.replace("Restart=always", "Restart=sometimes"))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True)
    assert "restart specifier" in done.stdout + done.stderr
