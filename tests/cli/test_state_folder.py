"""The state folder ($FAAS_GPU_HOME, ./.faas-gpu) is private like the secrets: 0700 folders, 0600 files.

Stat-ed after a real stack start that has deployed, invoked (sync and async) and stored a secret,
and after a `faas-gpu build` into the image store.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import requests

from tests.stack_process import StackProcess


def deploy(stack, service: str) -> requests.Response:
    body = {"service": service, "image": f"functions/{service}:latest", "envProcess": "cat"}
    return requests.post(f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=30)


def leaks(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Every entry under `root` that its group or others may read, write or enter. A folder a
    replica owns (its sandbox's /tmp, HOME: its own uid, 0700) is checked, not what the function
    wrote inside it: nobody else can enter it."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if name in skip or os.path.islink(path):
                continue
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode & 0o077:
                found.append(f"{oct(mode)} {path}")
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(folder, d)).st_uid == os.geteuid()]
    return found


def test_state_folder_is_private_after_a_stack_start(tmp_path):
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)  # as an older version left them: 0755
    os.chmod(home, 0o755)
    os.chmod(home / "logs", 0o755)
    s = StackProcess(home).start()
    try:
        assert deploy(s, "priv").status_code == 202
        s.wait_ready("priv", timeout_s=30)
        assert requests.post(f"{s.url}/function/priv", data=b"x", timeout=10).status_code == 200
        r = requests.post(f"{s.url}/async-function/priv", data=b"x", timeout=10)
        assert r.status_code == 202
        assert (
            requests.post(
                f"{s.url}/system/secrets", json={"name": "k", "value": "v"}, auth=s.auth, timeout=5
            ).status_code
            == 202
        )
        time.sleep(0.5)
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
        assert {"state.db", "logs", "queue.db", "run", "function-secrets", "secrets"} <= set(os.listdir(home))
        assert leaks(home, skip=("stack-test.log",)) == []  # the test's own log, written by this process
    finally:
        s.stop()


def test_image_store_is_private_after_a_build(tmp_path, monkeypatch):
    from faas_gpu import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAAS_GPU_HOME", str(tmp_path / "home"))
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "handler.py").write_text("def handle(event, context):\n    return event.body\n")
    os.chmod(tmp_path / "echo" / "handler.py", 0o644)
    (tmp_path / "stack.yml").write_text(
        "version: 1.0\nprovider: {name: openfaas}\nfunctions:\n"
        "  echo: {lang: python3-gpu, handler: ./echo, image: me/echo:latest}\n"
    )
    before = os.umask(0o022)
    try:
        assert cli.main(["build"]) == 0
        assert os.umask(0o022) == 0o022  # the caller's umask is given back
    finally:
        os.umask(before)
    images = tmp_path / "home" / "images"
    assert any(images.iterdir())
    assert leaks(tmp_path / "home") == []


def test_a_start_tightens_every_entry_the_stack_writes_and_leaves_other_files_alone(tmp_path):
    """An older version's state folder left readable: what faas-gpu wrote in it (the supervisor's
    lock, `faas-gpu down`'s marker, the fork server's and the containers' folders, pid files being
    replaced) becomes private on the next start; a file of the user's beside them keeps its mode."""
    from faas_gpu import paths

    ours = [paths.DOWN_FILE, paths.LOCK_FILE, paths.STACK_FILE, "replica-uids.json", ".provider.pid.42"]
    folders = ["forkserver", "containers", "run", "logs"]
    for name in ours:
        (tmp_path / name).write_text("x")
        (tmp_path / name).chmod(0o644)
    for name in folders:
        (tmp_path / name).mkdir()
        (tmp_path / name).chmod(0o755)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "notes.txt").chmod(0o644)
    paths.ensure_private_home(tmp_path)
    assert {n: oct(stat.S_IMODE((tmp_path / n).stat().st_mode)) for n in ours + folders} == {
        **{n: oct(0o600) for n in ours},
        **{n: oct(0o700) for n in folders},
    }
    assert stat.S_IMODE((tmp_path / "notes.txt").stat().st_mode) == 0o644
