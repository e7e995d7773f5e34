"""The fork server's socket refuses whoever is not the provider that started it, and whatever is
not a request it may serve (issue 44). The server is started by this test process, which is then
its provider; a replica's uid, another process of the provider's own uid and malformed requests
from the provider itself are each refused, and nothing is forked for them."""

from __future__ import annotations

import marshal
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faas_gpu.paths import TEMPLATES_DIR
from faas_gpu.sandbox.replica import ISOLATED_BY_UID, NOT_ISOLATED, Sandbox
from faas_gpu.sandbox.uids import FIRST_UID

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="switches uids: needs root")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zygote") / "forkserver"
    folder.mkdir(mode=0o700)
    path = str(folder / "socket")
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "faas_gpu.sandbox.zygote", path, str(TEMPLATES_DIR / "python3-gpu")]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    yield proc, path
    proc.stdin.close()
    proc.wait(10)


def children(pid: int) -> list[str]:
    """The server's children once the relays of refused requests (they answer, then exit) are
    reaped; a relay that stays is a replica forked for a request that should have had none."""
    deadline = time.monotonic() + 10
    while True:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def memory(pid: int) -> bytes:
    """Every readable byte of `pid`'s memory: what a replica forked from it starts with."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if fields[1][0] != "r" or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
    return b"".join(chunks)


def ask(path: str, payload: bytes, fds: list[int] | None = None) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.settimeout(10)
        conn.connect(path)
        socket.send_fds(conn, [payload], fds or [])
        return marshal.loads(conn.recv(65536))


def request(sb: Sandbox, site: list[str] | None = None) -> bytes:
    return marshal.dumps({"sandbox": sb.encode(), "site": site or []})


def in_child(fn) -> tuple[int, str]:
    """Run `fn` in a forked child; its exit code and what it wrote."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            said = fn()
            code = 0
        except BaseException as exc:  # noqa: BLE001
            said, code = f"{type(exc).__name__}: {exc}", 1
        os.write(w, str(said).encode())
        os._exit(code)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out.decode()


def test_a_replicas_uid_cannot_even_reach_the_socket(server):
    proc, path = server

    def as_a_replica():
        os.setgroups([])
        os.setresgid(FIRST_UID + 7, FIRST_UID + 7, FIRST_UID + 7)
        os.setresuid(FIRST_UID + 7, FIRST_UID + 7, FIRST_UID + 7)
        return ask(path, b"x")

    code, said = in_child(as_a_replica)
    assert code == 1 and "PermissionError" in said, said
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert children(proc.pid) == []


def test_a_process_that_is_not_its_provider_is_refused_even_as_root(server):
    proc, path = server
    sb = Sandbox(["/bin/true"], {}, "/", mode=ISOLATED_BY_UID, uid=FIRST_UID + 7, gid=FIRST_UID + 7)
    out_r, out_w = os.pipe()
    # a forked child: the same uid as the provider and reaching the socket, but another pid
    code, said = in_child(lambda: ask(path, request(sb), [out_w]))
    os.close(out_w)
    os.close(out_r)
    assert code == 0 and "refused" in said and "pid" not in said, said
    assert children(proc.pid) == []


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"\x00garbage", "not a fork server request"),
        (marshal.dumps([1, 2, 3]), "sandbox (bytes) and site"),
        (marshal.dumps({"sandbox": b"\x00", "site": []}), "not a sandbox"),
        (request(Sandbox(["/bin/true"], {}, "/", mode=NOT_ISOLATED)), "isolated replicas only"),
        (request(Sandbox(["/bin/true"], {}, "/", mode=ISOLATED_BY_UID, uid=0, gid=0)), "unprivileged"),
        (request(Sandbox(["/bin/true"], {}, "/", mode=ISOLATED_BY_UID, uid=None, gid=None)), "unprivileged"),
        (request(Sandbox(["/bin/true"], {}, "relative", mode=ISOLATED_BY_UID, uid=FIRST_UID, gid=FIRST_UID)), "cwd"),
        (
            request(Sandbox(["/bin/true"], {}, "/", mode=ISOLATED_BY_UID, uid=FIRST_UID, gid=FIRST_UID), ["rel"]),
            "absolute",
        ),
    ],
)
def test_a_malformed_request_from_the_provider_itself_is_refused(server, payload, why):
    proc, path = server
    out_r, out_w = os.pipe()
    try:
        said = ask(path, payload, [out_w])
    finally:
        os.close(out_w)
        os.close(out_r)
    assert "pid" not in said and why in said["error"], said
    assert children(proc.pid) == []


def test_descriptors_must_be_the_output_and_the_files_nothing_more(server):
    proc, path = server
    sb = Sandbox(["/bin/true"], {}, "/", mode=ISOLATED_BY_UID, uid=FIRST_UID + 7, gid=FIRST_UID + 7)
    said = ask(path, request(sb))  # no output descriptor
    assert "descriptors expected" in said["error"]
    fds = [os.open("/dev/null", os.O_WRONLY) for _ in range(3)]
    try:
        said = ask(path, request(sb), fds)  # more than it has files for
    finally:
        for fd in fds:
            os.close(fd)
    assert "descriptors expected" in said["error"]
    fds = [os.open("/dev/null", os.O_WRONLY) for _ in range(12)]
    try:
        said = ask(path, request(sb), fds)  # more than any request has
    finally:
        for fd in fds:
            os.close(fd)
    assert "descriptors" in said["error"]
    said = ask(path, b"\0" * (100 << 10))  # over the size of any request
    assert "over" in said["error"]
    assert children(proc.pid) == []


def test_a_function_environment_with_its_own_copy_of_a_loaded_package_is_sent_back_to_exec(server, tmp_path):
    proc, path = server
    site = tmp_path / "site-packages"
    (site / "torch").mkdir(parents=True)
    sb = Sandbox(["/bin/true"], {}, "/", mode=ISOLATED_BY_UID, uid=FIRST_UID + 7, gid=FIRST_UID + 7)
    out_r, out_w = os.pipe()
    try:
        said = ask(path, request(sb, [str(site)]), [out_w])
    finally:
        os.close(out_w)
        os.close(out_r)
    assert said["fallback"] is True and "'torch'" in said["error"], said
    assert children(proc.pid) == []


def test_the_server_is_single_threaded_with_a_clean_environment(server):
    proc, _path = server
    assert os.listdir(f"/proc/{proc.pid}/task") == [str(proc.pid)]
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    assert sorted(e.split(b"=")[0] for e in environ if e) == [b"OMP_NUM_THREADS", b"PATH", b"PYTHONPATH"]
    assert proc.poll() is None


def test_a_request_leaves_nothing_of_its_function_in_the_server_for_later_replicas(server):
    """A forked replica starts with the server's memory, freed blocks and all: one function's
    environment (its envVars, an API key among them) decoded there would be readable by every
    replica of every function forked after it (issue 41)."""
    proc, path = server
    secret = "sk-" + os.urandom(24).hex()
    sb = Sandbox(["/bin/true"], {"API_KEY": secret}, "/", mode=ISOLATED_BY_UID, uid=FIRST_UID + 7, gid=FIRST_UID + 7)
    for site in (["relative"], [], ["relative"]):  # refused by the relay, and one too many descriptors
        out_r, out_w = os.pipe()
        extra = os.open("/dev/null", os.O_WRONLY)
        try:
            said = ask(path, request(sb, site), [out_w] + ([extra] if not site else []))
        finally:
            for fd in (out_r, out_w, extra):
                os.close(fd)
        assert "pid" not in said and said.get("error"), said
    assert children(proc.pid) == []
    seen = memory(proc.pid)
    assert secret.encode() not in seen and secret.encode("utf-16-le") not in seen
    assert secret.encode("utf-32-le") not in seen
