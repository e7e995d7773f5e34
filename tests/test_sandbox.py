"""faas_gpu.sandbox on its own: the launcher, the walls it builds, and each function's uid.

Real processes and real namespaces (the launcher as the provider runs it); a test that needs
root or namespaces this host does not give skips, naming why.
"""

from __future__ import annotations

import marshal
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faas_gpu import sandbox
from faas_gpu.procs import alive

ROOT = os.geteuid() == 0
UID = sandbox.FIRST_UID + sandbox.UID_COUNT - 1  # a uid of the range no other test's function gets


def launch(box: sandbox.Sandbox, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(
        sandbox.launcher_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs
    )
    with proc.stdin:
        proc.stdin.write(box.encode())
    return proc


def output(box: sandbox.Sandbox, **kwargs) -> tuple[int, str]:
    """Run `box` to its end: its exit status and what it printed."""
    done = subprocess.run(
        sandbox.launcher_argv(), input=box.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
        **kwargs,
    )  # fmt: skip
    return done.returncode, done.stdout.decode()


def walled(tmp_path: Path, script: str, **kwargs) -> sandbox.Sandbox:
    """`sh -c script` with the stack's walls: `tmp_path/state` hidden, `tmp_path/own` its /tmp."""
    own = tmp_path / "own"
    own.mkdir(exist_ok=True)
    if ROOT:
        os.chown(own, UID, UID)
    kwargs.setdefault("mode", sandbox.ISOLATED_BY_UID if ROOT else sandbox.ISOLATED_BY_USERNS)
    if ROOT:
        kwargs.setdefault("uid", UID)
        kwargs.setdefault("gid", UID)
    return sandbox.Sandbox(
        ["/bin/sh", "-c", script],
        {"PATH": "/usr/bin:/bin"},
        "/",
        hide=[str(tmp_path / "state")],
        mounts=[sandbox.Mount(own, "/tmp", writable=True)],
        parent=os.getpid(),
        **kwargs,
    )


@pytest.fixture
def namespaces(tmp_path):
    """Skip where this host cannot build the walls at all (no namespaces for us)."""
    said = sandbox.probe(walled(tmp_path, "true"))
    if said is not None:
        pytest.skip(f"no namespaces here: {said}")


def test_a_sandbox_is_plain_data_on_the_launchers_stdin():
    box = sandbox.Sandbox(
        ["/bin/true"],
        {"A": "1"},
        "/",
        mode=sandbox.ISOLATED_BY_UID,
        uid=7,
        gid=8,
        hide=["/h"],
        mounts=[sandbox.Mount("/s", "/t", writable=True)],
        tmpfs=["/dev/shm"],
        files={3: "/f"},
        parent=1,
    )
    again = sandbox.Sandbox.decode(box.encode())
    assert marshal.loads(again.encode()) == marshal.loads(box.encode())
    assert again.mounts[0].writable and again.files == {3: "/f"} and again.uid == 7
    with pytest.raises(ValueError):
        sandbox.Sandbox.decode(marshal.dumps([1]))
    with pytest.raises(ValueError, match="mode"):
        sandbox.Sandbox(["/bin/true"], {}, "/", mode="bogus")


def test_inside_the_hidden_folder_is_gone_its_own_tmp_is_private_and_the_rest_read_only(tmp_path, namespaces):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "password").write_text("hunter2")
    (tmp_path / "elsewhere").write_text("not mine")
    script = (
        f"cat {tmp_path}/state/password; ls -A /tmp; echo mine > /tmp/f; id -u; echo $$; "
        "ls /proc | grep -c '^[0-9]'; env"
    )
    done = output(walled(tmp_path, script))[1]
    assert "hunter2" not in done and "No such file or directory" in done
    assert (tmp_path / "own" / "f").read_text() == "mine\n"  # its /tmp is its own folder
    lines = done.splitlines()
    uid_line = lines.index(str(UID) if ROOT else str(os.geteuid()))
    assert lines[uid_line + 1] == "1"  # PID 1 of its own PID namespace
    assert int(lines[uid_line + 2]) <= 3  # and its /proc shows only its own processes
    assert "PATH=/usr/bin:/bin" in lines and not [line for line in lines if line.startswith("HOME=")]


def test_mounts_come_back_read_only_where_the_host_has_no_folder(tmp_path, namespaces):
    (tmp_path / "state").mkdir()
    secrets = tmp_path / "state" / "secrets"  # inside the hidden folder: opened before it is hidden
    secrets.mkdir()
    (secrets / "api-key").write_text("s3cret")
    os.chmod(secrets / "api-key", 0o644)
    os.chmod(secrets, 0o755)
    box = walled(tmp_path, "cat /var/openfaas/secrets/api-key; echo; echo x > /var/openfaas/secrets/new; ls /var")
    box.mounts.append(sandbox.Mount(secrets, "/var/openfaas/secrets"))
    done = output(box)[1]
    assert done.startswith("s3cret\n") and "Read-only file system" in done
    assert "openfaas" in done.split() and "lib" in done.split()  # /var grafted: what it held is still there
    assert not Path("/var/openfaas").exists()  # nothing of it reached the host


def test_a_hidden_folder_inside_a_folder_let_back_in_stays_hidden(tmp_path, namespaces):
    """A checkout in the stack user's home, its state folder inside it (`./.faas-gpu`), an image in
    that: the home is hidden, the checkout comes back, its state folder is hidden again, the image
    comes back."""
    home = tmp_path / "state"  # hidden by `walled`: the user's home here
    repo, image = home / "repo", home / "repo" / ".faas-gpu" / "images" / "fn"
    image.mkdir(parents=True)
    (repo / "code.py").write_text("code")
    (repo / ".faas-gpu" / "password").write_text("hunter2")
    (image / "handler.py").write_text("handler")
    for path in (tmp_path, home, repo, repo / ".faas-gpu", image.parent, image):
        os.chmod(path, 0o755)
    for path in (repo / "code.py", repo / ".faas-gpu" / "password", image / "handler.py"):
        os.chmod(path, 0o644)  # readable by anyone: only the walls keep it away
    script = f"cat {repo}/code.py {repo}/.faas-gpu/password {image}/handler.py; ls -A {home} {repo}/.faas-gpu"
    box = sandbox.Sandbox(
        ["/bin/sh", "-c", script],
        {"PATH": "/usr/bin:/bin"},
        "/",
        mode=sandbox.ISOLATED_BY_USERNS,  # the stack's own uid: only the walls keep the password away
        hide=[str(home), str(repo / ".faas-gpu")],
        mounts=[sandbox.Mount(repo, repo), sandbox.Mount(image, image)],
        parent=os.getpid(),
    )
    done = output(box)[1]
    assert done.startswith("code") and "handler" in done and "hunter2" not in done, done
    assert f"{home}:\nrepo\n" in done and f"{repo}/.faas-gpu:\nimages\n" in done, done


def test_no_capability_and_no_new_privileges(tmp_path, namespaces):
    script = "grep -E '^(Cap(Prm|Eff|Bnd|Amb)|NoNewPrivs)' /proc/self/status"
    done = output(walled(tmp_path, script))[1].split()
    assert done == [*[w for cap in ("Prm", "Eff", "Bnd", "Amb") for w in (f"Cap{cap}:", "0" * 16)], "NoNewPrivs:", "1"]


def test_the_launcher_relays_sigterm_and_exits_as_its_program_does(tmp_path, namespaces):
    proc = launch(walled(tmp_path, "trap 'echo stopping; exit 3' TERM; echo ready; while :; do sleep 0.05; done"))
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.read() == b"stopping\n" and proc.wait(10) == 3


def test_the_sandbox_dies_with_its_launcher_and_the_launcher_with_its_parent(tmp_path, namespaces):
    pid_file = tmp_path / "own" / "pid"
    proc = launch(walled(tmp_path, "sleep 600 & echo $! > /tmp/pid; wait"), start_new_session=True)
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1
    first = int(children[0])  # PID 1 of the sandbox, the program
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(first)  # and with it every process in its PID namespace


def test_a_launcher_whose_parent_is_not_the_one_named_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    box = sandbox.Sandbox(["/bin/touch", str(marker)], {}, "/", parent=1)
    assert launch(box).wait(30) == 1 and not marker.exists()


def test_unisolated_it_is_still_a_clean_environment_and_a_file_opened_for_it(tmp_path):
    traces = tmp_path / "traces.jsonl"
    box = sandbox.Sandbox(
        ["/bin/sh", "-c", "echo span >&3; env"], {"PATH": "/usr/bin:/bin"}, str(tmp_path), files={3: str(traces)}
    )
    done = output(box, env={**os.environ, "SECRET_OF_THE_STACK": "x"})[1]
    assert "SECRET_OF_THE_STACK" not in done and "PATH=/usr/bin:/bin" in done
    assert traces.read_text() == "span\n"


@pytest.mark.skipif(not ROOT, reason="a uid of its own needs a root stack")
def test_a_file_the_launcher_opens_is_written_by_a_uid_that_could_not_open_it(tmp_path, namespaces):
    traces = tmp_path / "traces.jsonl"
    traces.write_text("")
    os.chmod(traces, 0o600)  # root's alone
    box = walled(tmp_path, f"echo span >&3; cat {traces}", files={3: str(traces)})
    done = output(box)[1]
    assert "span" not in done and traces.read_text() == "span\n"  # it writes there, and cannot read it


def test_a_sandbox_that_cannot_be_built_says_why_and_runs_nothing(tmp_path, namespaces):
    box = walled(tmp_path, "echo ran")
    box.mounts.append(sandbox.Mount(tmp_path / "absent", "/var/openfaas/secrets"))
    code, out = output(box)
    assert code == 126 and "ran" not in out and "absent" in out
    assert sandbox.probe(box) is not None and "absent" in sandbox.probe(box)


@pytest.mark.skipif(not ROOT, reason="dropping to another uid needs root")
def test_a_uid_sandbox_refuses_root(tmp_path, namespaces):
    box = walled(tmp_path, "echo ran", uid=0, gid=0)
    assert "unprivileged uid" in (sandbox.probe(box) or "")


def test_each_function_keeps_its_uid_across_restarts_and_no_two_share_one(tmp_path):
    table = sandbox.UidTable(tmp_path / "uids.json")
    a, b = table.uid("openfaas-fn/a"), table.uid("openfaas-fn/b")
    assert a != b and all(sandbox.FIRST_UID <= u < sandbox.FIRST_UID + sandbox.UID_COUNT for u in (a, b))
    again = sandbox.UidTable(tmp_path / "uids.json")
    assert again.uid("openfaas-fn/b") == b and again.uid("openfaas-fn/a") == a


def test_uids_of_this_hosts_users_are_never_given(tmp_path):
    import pwd

    real = sorted(u.pw_uid for u in pwd.getpwall())
    first = real[-1]  # a real user's uid, and the two after it
    table = sandbox.UidTable(tmp_path / "uids.json", first=first, count=3)
    given = {table.uid(f"ns/f{i}") for i in range(2)}
    assert first not in given and len(given) == 2
    with pytest.raises(sandbox.SandboxError, match="no free uid"):
        table.uid("ns/third")


def test_uids_in_other_users_subordinate_ranges_are_never_given(monkeypatch, tmp_path):
    first = sandbox.FIRST_UID
    monkeypatch.setattr(sandbox, "_subordinate_ranges", lambda: [(first, first + 3)])  # /etc/subuid's
    table = sandbox.UidTable(tmp_path / "uids.json", first=first, count=4)
    assert table.uid("ns/f") == first + 3


def test_the_launcher_needs_no_site_packages():
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import runpy; runpy.run_path({sandbox.__file__!r}, run_name='x')"],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
