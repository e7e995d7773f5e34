"""A replica's walls (`faas_gpu.sandbox.replica`) and its launcher on their own: what a tenant's
code can and cannot do inside.

Real processes and real namespaces (the launcher as the provider runs it); a test that needs
root or namespaces this host does not give skips, naming why.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from faas_gpu.paths import REPO_ROOT
from faas_gpu.procs import alive
from faas_gpu.sandbox import launcher
from faas_gpu.sandbox import replica as sandbox
from faas_gpu.sandbox.uids import FIRST_UID, UID_COUNT

ROOT = os.geteuid() == 0
UID = FIRST_UID + UID_COUNT - 1  # a uid of the range no other test's function gets


def launch(box: sandbox.Sandbox, **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(
        launcher.launcher_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs
    )
    with proc.stdin:
        proc.stdin.write(box.encode())
    return proc


def output(box: sandbox.Sandbox, **kwargs) -> tuple[int, str]:
    """Run `box` to its end: its exit status and what it printed."""
    done = subprocess.run(
        launcher.launcher_argv(), input=box.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
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
    said = launcher.probe(walled(tmp_path, "true"))
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


def test_no_capability_no_new_privileges_and_a_seccomp_filter(tmp_path, namespaces):
    script = "grep -E '^(Cap(Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status"
    done = output(walled(tmp_path, script))[1].split()
    caps = [w for cap in ("Prm", "Eff", "Bnd", "Amb") for w in (f"Cap{cap}:", "0" * 16)]
    assert done == [*caps, "NoNewPrivs:", "1", "Seccomp:", "2"]  # 2: a filter, kept across the watchdog's execve


ATTACKS = r"""
import ctypes, errno, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
def said(result):
    return "ok" if result != -1 else errno.errorcode[ctypes.get_errno()]
victim = os.fork()
if victim == 0:
    time.sleep(30)
    os._exit(0)
print("ptrace", said(libc.ptrace(16, victim, None, None)))  # PTRACE_ATTACH: a process of its own uid
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
print("process_vm_readv", said(libc.syscall(310, victim, iov, 1, iov, 1, 0)))
print("unshare", said(libc.unshare(0x10000000)))  # a user namespace: root inside, the kernel's surface
print("bpf", said(libc.syscall(321, 0, None, 0)))
print("keyctl", said(libc.syscall(250, 0, 0, 0, 0, 0)))
print("mount", said(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
os.kill(victim, signal.SIGKILL)
os.waitpid(victim, 0)
child = os.fork()  # what functions do need still works: processes, threads, a program
if child == 0:
    os._exit(7)
import threading, subprocess
t = threading.Thread(target=lambda: None)
t.start()
t.join()
cat = subprocess.run(["cat"], input=b"cat ok", capture_output=True).stdout.decode()
print("fork", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), "thread ok", cat)
"""


def test_a_replica_cannot_trace_another_process_nor_reach_the_kernels_wider_surface(tmp_path, namespaces):
    """What the seccomp filter refuses, tried from inside (EPERM), on a process of the replica's
    own uid that ptrace would otherwise reach; and what a function needs still runs."""
    box = walled(tmp_path, "")
    box.argv = ["/usr/bin/python3", "-I", "-c", ATTACKS]
    code, done = output(box)
    assert code == 0, done
    seen = dict(line.split(" ", 1) for line in done.splitlines())
    for call in ("ptrace", "process_vm_readv", "unshare", "bpf", "keyctl", "mount"):
        assert seen[call] == "EPERM", (call, done)
    assert seen["fork"] == "7 thread ok cat ok", done


def test_a_replica_writes_only_its_own_folders(tmp_path, namespaces):
    """The host's tree is read-only inside: a world-writable folder (as /run/lock is) can carry
    nothing from one tenant to another, and a stack run as a user keeps its own files; the
    replica's /tmp and /dev/shm are its own."""
    shared = Path(tempfile.mkdtemp(prefix="faas-gpu-shared-", dir="/var/tmp"))
    try:
        os.chmod(shared, 0o1777)
        box = walled(
            tmp_path, f"echo x > {shared}/from-a-tenant; echo x > /tmp/mine && echo x > /dev/shm/mine && echo own ok"
        )
        box.tmpfs = ["/dev/shm"]
        code, done = output(box)
        assert "Read-only file system" in done and done.rstrip().endswith("own ok"), done
        assert list(shared.iterdir()) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)


FORKED = r"""
import ctypes, json, os, sys
from faas_gpu.sandbox import replica

state, own, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
mode = replica.ISOLATED_BY_UID if uid else replica.ISOLATED_BY_USERNS
sb = replica.Sandbox(
    ["/bin/false"], {"PATH": "/usr/bin:/bin", "ONLY": "this"}, "/", mode=mode, uid=uid or None, gid=uid or None,
    hide=[state], mounts=[replica.Mount(own, "/tmp", writable=True)],
)
r, w = os.pipe()
if os.fork() == 0:  # the template's child: namespaces, then the replica's first process
    replica.unshare_namespaces(sb)
    pid = os.fork()
    if pid == 0:
        replica.enter(sb)  # no execve: this process imports the handler next
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        fields = open("/proc/self/stat").read().rpartition(")")[2].split()
        start, end = int(fields[47]), int(fields[48])
        out = {k: status[k].strip() for k in ("Uid", "Seccomp", "NoNewPrivs", "CapBnd", "CapEff")}
        out["pid"] = os.getpid()
        out["dumpable"] = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        out["environ"] = dict(os.environ)
        out["template's env left"] = b"TEMPLATE_SECRET" in ctypes.string_at(start, end - start)
        out["state"] = os.path.exists(os.path.join(state, "password"))
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
os.close(w)
got = json.loads(os.read(r, 65536))
got["template's seccomp"] = open("/proc/self/status").read().split("Seccomp:")[1].split()[0]
print(json.dumps(got))
"""


def test_entered_from_a_forked_child_the_walls_hold_without_an_exec(tmp_path, namespaces):
    """Issue 44's path: a template process forks, the child makes the namespaces and forks the
    replica's first process, which enters the walls and runs on without an execve: PID 1, its
    uid, the filter, no capability, not dumpable, exactly its environment (the template's gone
    from its memory too); the template itself keeps none of the walls."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "password").write_text("hunter2")
    own = tmp_path / "own"  # made by the `namespaces` fixture, the sandbox's uid's
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), "TEMPLATE_SECRET": "of the template"}
    done = subprocess.run(
        [sys.executable, "-c", FORKED, str(tmp_path / "state"), str(own), str(UID if ROOT else 0)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["pid"] == 1 and got["Uid"].split() == [str(UID if ROOT else os.geteuid())] * 4
    assert got["Seccomp"] == "2" and got["NoNewPrivs"] == "1" and got["dumpable"] == 0
    assert int(got["CapBnd"], 16) == int(got["CapEff"], 16) == 0
    assert got["environ"] == {"PATH": "/usr/bin:/bin", "ONLY": "this"} and not got["template's env left"]
    assert got["state"] is False and got["template's seccomp"] == "0"


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
    assert launcher.probe(box) is not None and "absent" in launcher.probe(box)


@pytest.mark.skipif(not ROOT, reason="dropping to another uid needs root")
def test_a_uid_sandbox_refuses_root(tmp_path, namespaces):
    box = walled(tmp_path, "echo ran", uid=0, gid=0)
    assert "unprivileged uid" in (launcher.probe(box) or "")


def test_the_launcher_loads_only_the_standard_library_and_the_replicas_walls():
    """Every replica's start waits for the launcher's interpreter: it runs without site packages
    (-I -S) and imports nothing of faas-gpu but the walls (a heavier import would slow every start)."""
    box = sandbox.Sandbox(["/bin/true"], {}, "/", parent=os.getpid())
    argv = launcher.launcher_argv()
    assert argv[1:3] == ["-I", "-S"] and argv[3] == launcher.LAUNCHER and launcher.LAUNCHER.endswith("launcher.py")
    done = subprocess.run(
        [*argv[:3], "-X", "importtime", *argv[3:]], input=box.encode(), capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    modules = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    ours = {m for m in modules if m.startswith("faas_gpu")}
    assert ours == {"faas_gpu", "faas_gpu.sandbox", "faas_gpu.sandbox.primitives", "faas_gpu.sandbox.replica"}
    assert not modules & {"site", "json", "pathlib", "dataclasses", "platform", "subprocess"}, modules
