"""Tenants are apart on the local runtime (issue 41, finding 4), attacked as the finding did it.

A real stack (`provider.server` on its own state folder, with a scheduler address so that replicas
get their function's token, and the cluster token in the folder as the GPU daemons leave it) runs
functions with `envProcess: sh`: the classic watchdog forks `sh` per call with the body on stdin,
so each call runs the attacker's shell script. Before: the replica ran as the stack's user beside
it, read the admin password, the cluster token, every function's token and the datastore, found
the state folder in the provider's /proc/<pid>/environ, and `printenv` showed its token, the
provider's pid and the state folder's paths to anyone. Its secrets were not at
/var/openfaas/secrets/<name>.

The stack runs as root here: replicas get a uid of their function's own. The same walls for a
stack run as a user (user namespaces) are `test_an_unprivileged_stacks_replicas_are_walled_off_too`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests

from faas_gpu.contract.replica import STANDARD_PATH
from faas_gpu.credentials import ensure_token
from faas_gpu.paths import REPO_ROOT
from faas_gpu.sandbox import FIRST_UID, UID_COUNT
from tests.stack_process import StackProcess

from .test_process_groups import children, replica_pids, tree

SECRET = "s3cr3t-of-tenant-a"


def deploy(stack: StackProcess, name: str, **fields) -> None:
    body = {"service": name, "image": f"functions/{name}:latest", **fields}
    r = requests.post(f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=10)
    assert r.status_code == 202, r.text
    stack.wait_ready(name)


def run(stack: StackProcess, name: str, script: str) -> str:
    """What `script` prints, run by the function's `sh` (stdout and stderr, as the classic watchdog
    answers them)."""
    r = requests.post(f"{stack.url}/function/{name}", data=script.encode(), timeout=30)
    return r.text


def isolation_of(stack: StackProcess) -> dict | None:
    return stack.request("GET", "/system/info").json()["provider"].get("faasGpuIsolation")


def start_attacked_stack(home: Path, stack: StackProcess) -> StackProcess:
    ensure_token(home / "secrets")  # the cluster token, as a GPU Manager sharing the folder leaves it
    stack.start()
    said = isolation_of(stack)
    if said is not None and not said["isolated"]:  # main says nothing: the test then runs, and fails
        stack.stop()
        pytest.skip(f"this host cannot isolate functions: {said['message']}")
    r = stack.request("POST", "/system/secrets", json={"name": "api-key", "value": SECRET})
    assert r.status_code == 202, r.text
    deploy(stack, "tenant-a", envProcess="sh", secrets=["api-key"])
    deploy(stack, "tenant-b", envProcess="sh")
    deploy(stack, "printenv", envProcess="env")
    return stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("tenants") / ".faas-gpu"
    home.mkdir()
    s = start_attacked_stack(home, StackProcess(home, "--scheduler", "http://127.0.0.1:9"))
    yield s
    s.stop()


def state_files(stack: StackProcess) -> dict[str, str]:
    """The state folder's credentials and datastore, as the provider holds them."""
    secrets = stack.home / "secrets"
    tokens = {p.name: p.read_text().strip() for p in (secrets / "function-tokens").iterdir()}
    assert len(tokens) >= 3  # every function's
    return {
        "admin password": (secrets / "basic-auth-password").read_text().strip(),
        "cluster token": (secrets / "gpu-manager-token").read_text().strip(),
        **{f"token of {name}": token for name, token in tokens.items()},
    }


def test_a_function_reads_none_of_the_stacks_credentials_nor_its_datastore(stack):
    home = stack.home
    loot = run(
        stack,
        "tenant-a",
        f"cat {home}/secrets/basic-auth-password {home}/secrets/gpu-manager-token; "
        f"ls -la {home}/secrets/function-tokens; cat {home}/secrets/function-tokens/*; "
        f"head -c 4096 {home}/state.db; ls -la {home} {home}/images {home}/function-secrets; "
        f"cat {home}/function-secrets/openfaas-fn/api-key; find / -xdev -name state.db 2>/dev/null",
    )
    assert (home / "state.db").exists()
    for what, value in state_files(stack).items():
        assert value not in loot, f"the function read the {what}"
    assert "SQLite" not in loot and SECRET not in loot, loot
    assert str(home / "state.db") not in loot.split(), loot  # `find` met no datastore anywhere
    assert "No such file or directory" in loot  # the state folder is not there at all


def test_the_providers_and_other_replicas_processes_are_out_of_sight(stack):
    arbiter = stack.proc.pid
    (provider,) = children(arbiter)  # gunicorn's one worker: the provider
    others = [pid for launcher in replica_pids(stack.home) for pid in tree(launcher)]
    script = "".join(f"cat /proc/{pid}/environ /proc/{pid}/cmdline; ls /proc/{pid}/root/; " for pid in others)
    loot = run(stack, "tenant-a", f"cat /proc/{provider}/environ /proc/{arbiter}/environ; {script}")
    assert "FAAS_GPU" not in loot and "provider.server" not in loot and str(stack.home) not in loot, loot
    assert len(others) >= 6  # three replicas, each a launcher and its watchdog: none of them seen
    # what it sees of /proc: its own watchdog (PID 1 of its own PID namespace), the shell, what it runs
    seen = run(stack, "tenant-a", r"for p in /proc/[0-9]*; do echo ${p#/proc/} $(tr '\0' ' ' < $p/cmdline); done")
    pids = {int(line.split()[0]): line for line in seen.splitlines() if line[:1].isdigit()}
    assert 1 in pids and "fwatchdog" in pids[1], seen
    assert len(pids) <= 4 and "gunicorn" not in seen and "provider" not in seen, seen


def test_its_own_secret_is_at_openfaas_path_read_only_and_nobody_elses(stack):
    assert run(stack, "tenant-a", "cat /var/openfaas/secrets/api-key") == SECRET
    answer = run(stack, "tenant-a", "echo x > /var/openfaas/secrets/api-key; ls -l /var/openfaas/secrets")
    assert "Read-only file system" in answer and "api-key" in answer
    assert run(stack, "tenant-b", "ls -A /var/openfaas/secrets; cat /var/openfaas/secrets/api-key") == (
        "cat: /var/openfaas/secrets/api-key: No such file or directory\n"
    )


def test_each_function_runs_as_an_unprivileged_uid_of_its_own(stack):
    ids = {}
    for name in ("tenant-a", "tenant-b"):
        uid, gid, groups = run(stack, name, "id -u; id -g; id -G").split()
        assert FIRST_UID <= int(uid) < FIRST_UID + UID_COUNT and gid == uid and groups == gid
        ids[name] = int(uid)
        caps = run(stack, name, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status")
        assert caps.split() == ["CapPrm:", "0" * 16, "CapEff:", "0" * 16, "CapBnd:", "0" * 16, "CapAmb:", "0" * 16]
    assert ids["tenant-a"] != ids["tenant-b"]
    # stable: the state folder's table keeps each function's uid across restarts
    table = (stack.home / "replica-uids.json").read_text()
    assert str(ids["tenant-a"]) in table and str(ids["tenant-b"]) in table
    assert run(stack, "tenant-a", "touch /etc/x /usr/x 2>&1; touch /tmp/x && echo /tmp-ok").count("denied") >= 1


def test_its_environment_is_what_faasd_gives_a_function_and_its_token_is_a_file(stack):
    env = dict(line.split("=", 1) for line in run(stack, "tenant-a", "env").splitlines() if "=" in line)
    assert env["HOME"] == "/home/app" and env["fprocess"] == "sh"
    assert env["PATH"] == f"{Path(sys.executable).parent}:{STANDARD_PATH}"
    for leaked in ("FAAS_GPU_TOKEN", "FAAS_GPU_PARENT_PID", "TMPDIR", "FAAS_GPU_HOME", "secret_mount_path", "USER"):
        assert leaked not in env, leaked
    assert not [v for v in env.values() if str(stack.home) in v], env
    tokens = {p.name: p.read_text().strip() for p in (stack.home / "secrets" / "function-tokens").iterdir()}
    assert not [t for t in tokens.values() if t in "\n".join(env.values())]
    # the GPU client's token: a read-only file in the sandbox, this function's own
    assert env["FAAS_GPU_TOKEN_FILE"] == "/var/openfaas/faas-gpu/token"
    assert run(stack, "tenant-a", "cat $FAAS_GPU_TOKEN_FILE") == tokens["openfaas-fn.tenant-a"]
    assert run(stack, "tenant-b", "cat $FAAS_GPU_TOKEN_FILE") == tokens["openfaas-fn.tenant-b"]


def test_printenv_shows_anyone_no_token_no_pid_and_no_state_path(stack):
    shown = requests.post(f"{stack.url}/function/printenv", data=b"", timeout=30).text
    env = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert "FAAS_GPU_TOKEN" not in env and "FAAS_GPU_PARENT_PID" not in env
    tokens = [p.read_text().strip() for p in (stack.home / "secrets" / "function-tokens").iterdir()]
    assert not [t for t in tokens if t in shown]
    (provider,) = children(stack.proc.pid)
    assert str(provider) not in env.values() and str(stack.proc.pid) not in env.values()
    assert str(stack.home) not in shown and str(stack.home.parent) not in shown, shown


# -- the same walls for a stack run as a user ----------------------------------------------------------
NOBODY = 65534


class UnprivilegedStack(StackProcess):
    """The stack as `nobody` (setpriv), with a state folder of its own: its replicas get user namespaces."""

    def popen(self, argv, **kwargs):
        kwargs["env"] = {**kwargs["env"], "HOME": str(self.home.parent), "XDG_CONFIG_HOME": str(self.home.parent)}
        return subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], **kwargs
        )


def _as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "HOME": "/"},
        timeout=60,
    )


@pytest.fixture
def nobody_home():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the stack as an unprivileged user")
    check = _as_nobody(sys.executable, "-c", "import faas_gpu, provider.server")
    if check.returncode != 0:
        pytest.skip(f"nobody cannot run the stack's code from {REPO_ROOT}: {check.stderr[-300:]}")
    root = Path(tempfile.mkdtemp(prefix="faas-gpu-nobody-"))
    os.chmod(root, 0o755)
    home = root / ".faas-gpu"
    home.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    os.chown(home, NOBODY, NOBODY)
    (home / "secrets").mkdir(mode=0o700)
    ensure_token(home / "secrets")
    for path in (home / "secrets", home / "secrets" / "gpu-manager-token"):
        os.chown(path, NOBODY, NOBODY)
    yield home
    shutil.rmtree(root, ignore_errors=True)


def test_an_unprivileged_stacks_replicas_are_walled_off_too(nobody_home):
    s = UnprivilegedStack(nobody_home, "--scheduler", "http://127.0.0.1:9")
    s.log_path = nobody_home.parent / "stack-test.log"
    try:
        start_attacked_stack(nobody_home, s)
        home = nobody_home
        # the same uid as the stack: only the mount namespace keeps its files away
        assert run(s, "tenant-a", "id -u").strip() == str(NOBODY)
        loot = run(
            s,
            "tenant-a",
            f"cat {home}/secrets/basic-auth-password {home}/secrets/gpu-manager-token {home}/secrets/function-tokens/*"
            f"; head -c 4096 {home}/state.db; ls {home.parent}",
        )
        for what, value in state_files(s).items():
            assert value not in loot, f"the function read the {what}"
        assert "SQLite" not in loot and "stack-test.log" not in loot and "No such file" in loot, loot
        (provider,) = children(s.proc.pid)
        loot = run(s, "tenant-a", f"cat /proc/{provider}/environ /proc/{s.proc.pid}/environ")
        assert "FAAS_GPU" not in loot, loot
        assert run(s, "tenant-a", "cat /var/openfaas/secrets/api-key") == SECRET
        env = run(s, "printenv", "")
        assert "FAAS_GPU_TOKEN=" not in env and str(home) not in env, env
        assert isolation_of(s)["mode"] == "userns"
    finally:
        s.stop()


class ContainerRootStack(UnprivilegedStack):
    """The stack as the root of a user namespace that maps one uid (a container's root) and may
    make no user namespace: the kernel refuses the walls."""

    def popen(self, argv, **kwargs):
        script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
        return super().popen(["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *argv], **kwargs)


def test_where_the_kernel_refuses_the_walls_the_stack_says_functions_are_not_isolated(nobody_home, monkeypatch):
    from faas_gpu.cli.up import functions_isolation

    s = ContainerRootStack(nobody_home)
    s.log_path = nobody_home.parent / "stack-test.log"
    try:
        s.start()
        said = isolation_of(s)
        assert said["isolated"] is False and said["mode"] == "none", said
        assert said["message"].startswith("functions are NOT isolated"), said
        monkeypatch.setenv("FAAS_GPU_HOME", str(nobody_home))
        assert functions_isolation(s.url).startswith("WARNING: functions are NOT isolated")
        deploy(s, "still-serves", envProcess="cat")  # unisolated, functions still run
        assert requests.post(f"{s.url}/function/still-serves", data=b"x", timeout=30).text == "x"
        assert "functions are NOT isolated" in s.log_path.read_text()
    finally:
        s.stop()
