"""What a local replica sees through its sandbox (provider/runtime/isolation.py), read off the
sandbox each replica gets; the walls themselves are tests/sandbox/test_replica.py's and
tests/provider/test_tenant_isolation.py's."""

from __future__ import annotations

import sys
from pathlib import Path

from faas_gpu.paths import REPO_ROOT
from faas_gpu.sandbox import replica as sandbox
from provider.runtime.isolation import Isolation, ReplicaFolders, Walls, hidden_paths, outermost, stack_paths


def test_each_path_is_bound_once_unless_a_hidden_folder_lies_between():
    hidden = ["/repo/.faas-gpu"]
    needed = ["/repo", "/repo/venv", "/repo/.faas-gpu/images/.fn@1", "/usr", "/usr/lib/python3"]
    assert outermost(needed, hidden) == ["/repo", "/repo/.faas-gpu/images/.fn@1", "/usr"]


def test_the_stacks_code_and_interpreter_come_in_read_only_and_the_state_folder_never(tmp_path):
    home = tmp_path / ".faas-gpu"
    home.mkdir()
    walls = Walls(home, Isolation(sandbox.ISOLATED_BY_USERNS), None)
    folders = ReplicaFolders.make(tmp_path / "run" / "r1", None)
    image = home / "images" / ".fn@1"
    box = walls.sandbox_of(["/bin/true"], {}, None, folders, None, image)
    read_only = {m.target for m in box.mounts if not m.writable}
    writable = {m.target: m.source for m in box.mounts if m.writable}
    assert str(home) in box.hide and str(image) in read_only
    for path in (str(REPO_ROOT), sys.prefix, sys.base_prefix, *stack_paths()):  # nobody writes the stack's code
        assert any(path == r or path.startswith(r + "/") for r in read_only), path
    assert writable == {"/tmp": str(folders.tmp), "/var/tmp": str(folders.var_tmp), "/home/app": str(folders.home)}
    assert {"/var/openfaas/secrets", "/var/openfaas/faas-gpu"} <= read_only
    assert box.cwd == "/home/app" and box.mode == sandbox.ISOLATED_BY_USERNS


def test_unisolated_a_replica_finds_its_folders_where_they_are(tmp_path):
    walls = Walls(tmp_path, Isolation(sandbox.NOT_ISOLATED, "off"), None)
    folders = ReplicaFolders.make(tmp_path / "run" / "r1", None)
    env = walls.replica_env(folders, token=True)
    assert env["HOME"] == str(folders.home) and env["TMPDIR"] == str(folders.tmp)
    assert env["secret_mount_path"] == f"{folders.secrets}/"
    assert env["FAAS_GPU_TOKEN_FILE"] == str(folders.faas_gpu / "token") and "FAAS_GPU_TOKEN" not in env
    assert (
        Isolation(sandbox.NOT_ISOLATED, "no namespaces").describe()["message"].startswith("functions are NOT isolated")
    )


def test_the_config_is_hidden_by_its_own_folder_never_by_a_folder_every_program_needs(tmp_path, monkeypatch):
    """Hiding $FAAS_GPU_CONFIG's folder took /etc from every replica when it named /etc/faas-gpu.yml."""
    from faas_gpu import paths
    from provider.runtime.isolation import config_hidden

    assert config_hidden(tmp_path / "xdg" / "faas-gpu" / "config.yml") == tmp_path / "xdg" / "faas-gpu"
    assert config_hidden(Path("/etc/faas-gpu.yml")) == Path("/etc/faas-gpu.yml")
    etc_file = tmp_path / "etc" / "faas-gpu.yml"
    etc_file.parent.mkdir()
    etc_file.write_text("stacks: []\n")
    monkeypatch.setenv("FAAS_GPU_CONFIG", str(etc_file))
    hidden = hidden_paths(tmp_path / ".faas-gpu")
    assert str(etc_file) in hidden and str(etc_file.parent) not in hidden
    monkeypatch.delenv("FAAS_GPU_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / paths.CONFIG_FOLDER_NAME).mkdir(parents=True)
    assert str(tmp_path / "xdg" / paths.CONFIG_FOLDER_NAME) in hidden_paths(tmp_path / ".faas-gpu")
