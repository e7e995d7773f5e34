"""A replica's sandbox: the walls a tenant's code runs inside on a host it shares with the stack.

Why: a function runs its user's code. Beside the daemons as the same user it read the admin
password, the cluster token, every function's token and the datastore from the state folder, and
the provider's environment from /proc (issue 41). faasd runs each function as a containerd task in
namespaces of its own; a plain process gets the same walls here, built from Linux namespaces with
no helper program (the design of bubblewrap, in Python):

- its own **mount namespace**, where the paths in `hide` do not exist (an empty read-only tmpfs over
  a folder, /dev/null over a file: the state folder, the stack user's home and config folder), and
  only `mounts` come back in, each at a path of its choosing (for a replica: its built image
  read-only, its own secrets read-only at OpenFaaS's /var/openfaas/secrets, its token, a private
  /tmp and HOME; `faas_gpu.contract.replica`);
- its own **PID namespace** with its own /proc: it sees its own processes only, and when its first
  process (the watchdog) exits the kernel kills every process it left behind;
- its own **IPC namespace** (System V IPC and POSIX message queues of its own) and /dev/shm;
- an **unprivileged uid of its function's own** (`UidTable`: stable, from `FIRST_UID` ..
  `FIRST_UID + UID_COUNT - 1`, skipping real users and subordinate-id ranges) when the stack runs as
  root; where the stack runs as a user, a **user namespace** mapping that user to itself gives the
  same mount and PID walls without privilege (the replica then has the stack user's uid and
  groups, and cannot read the folders hidden from it);
- no capabilities (bounding set emptied), `no_new_privs`, and a clean environment: exactly `env`;
- it dies with its launcher (`PR_SET_PDEATHSIG`), and the launcher with the provider.
The host network stays: the gateway reaches a replica on 127.0.0.1:<port> and the replica reaches
the scheduler and the GPU Managers with its function's token, as in faasd's host-network mode.

How: `Sandbox` is the whole description (plain data, so a launcher can take it on stdin).
`launch` (this file run as a script, `python -I -S sandbox.py`, standard library only) is what the
provider executes per replica: `unshare_namespaces`, a fork (the child is PID 1 of the new PID
namespace), then in the child `enter` (mounts, /proc, privileges) and `execve`. The same two calls
serve a fork server (issue 44: a replica forked from a template process): after the fork,
`unshare_namespaces`, fork again, `enter` in the grandchild, then import the handler instead of
`execve` (what the launcher adds to a start, an interpreter's start and its imports, is then gone).

`probe` says whether this kernel and user can build the walls at all; where they cannot, the
runtime runs replicas unisolated and says so (`faas-gpu up`, /system/info).
"""

from __future__ import annotations

import ctypes
import errno
import marshal
import os
import select
import signal
import stat
import sys

# -- Linux's numbers (uapi/linux/sched.h, mount.h, prctl.h, capability.h) -----------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522
_LAST_CAP = 63  # more than any kernel has: PR_CAPBSET_DROP answers EINVAL past the last

FIRST_UID = 0x70000000
"""The first uid of faas-gpu's replicas (1879048192): above the ranges hosts give users (below
60000), systemd's dynamic users (61184-65519) and systemd-nspawn's container ranges (up to
0x6FFFFFFF), and below 2^31, where some tools take a uid for negative."""
UID_COUNT = 65536
"""How many uids replicas may get (one per function), FIRST_UID up to 0x7000FFFF."""

ISOLATED_BY_UID = "uid"
"""The stack runs as root: namespaces, and the function's own uid."""
ISOLATED_BY_USERNS = "userns"
"""The stack runs as a user: namespaces inside a user namespace, the stack user's uid."""
NOT_ISOLATED = "none"


class SandboxError(Exception):
    """The sandbox could not be built; the message names the step and the path."""


class Mount:
    """`source` (a host path) seen at `target` inside, read-only unless `writable`."""

    __slots__ = ("source", "target", "writable")

    def __init__(self, source: str, target: str, writable: bool = False):
        self.source, self.target, self.writable = str(source), str(target), writable

    def to_list(self) -> list:
        return [self.source, self.target, self.writable]

    def __repr__(self) -> str:
        return f"Mount({self.source!r}, {self.target!r}, writable={self.writable})"


class Sandbox:
    """What one process runs in; every path absolute.

    `mode`: ISOLATED_BY_UID (root: namespaces and `uid`/`gid`), ISOLATED_BY_USERNS (a user: the
    same namespaces inside a user namespace) or NOT_ISOLATED (a clean environment and dying with
    the parent only). `hide`: paths that do not exist inside. `mounts`: bound in; with the hidden
    paths, outer paths first (a mount may lie inside a hidden or a private folder: an image inside
    the hidden state folder; a hidden path inside a mount stays hidden).
    `tmpfs`: private empty writable folders (/dev/shm). `files`: fd number -> a host file the
    launcher opens for appending before it gives up its privileges, passed to the process at that
    number (a traces file it could not open itself). `parent`: the pid the launcher must be a
    child of (it dies with it)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        *,
        mode: str = NOT_ISOLATED,
        uid: int | None = None,
        gid: int | None = None,
        hide: list[str] | None = None,
        mounts: list[Mount] | None = None,
        tmpfs: list[str] | None = None,
        files: dict[int, str] | None = None,
        parent: int | None = None,
    ):
        if mode not in (ISOLATED_BY_UID, ISOLATED_BY_USERNS, NOT_ISOLATED):
            raise ValueError(f"mode: {mode!r}")
        self.argv, self.env, self.cwd = list(argv), dict(env), str(cwd)
        self.mode, self.uid, self.gid = mode, uid, gid
        self.hide = [str(p) for p in hide or ()]
        self.mounts = list(mounts or ())
        self.tmpfs = [str(p) for p in tmpfs or ()]
        self.files = {int(k): str(v) for k, v in (files or {}).items()}
        self.parent = parent

    @property
    def namespaces(self) -> bool:
        return self.mode != NOT_ISOLATED

    def encode(self) -> bytes:
        """What the launcher reads on its stdin: `marshal` (no `json` to import in a process whose
        start every replica waits for; the launcher is the same interpreter as its writer)."""
        return marshal.dumps(
            {
                "argv": self.argv,
                "env": self.env,
                "cwd": self.cwd,
                "mode": self.mode,
                "uid": self.uid,
                "gid": self.gid,
                "hide": self.hide,
                "mounts": [m.to_list() for m in self.mounts],
                "tmpfs": self.tmpfs,
                "files": self.files,
                "parent": self.parent,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> Sandbox:
        d = marshal.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("not a sandbox")
        return cls(
            d["argv"],
            d["env"],
            d["cwd"],
            mode=d["mode"],
            uid=d.get("uid"),
            gid=d.get("gid"),
            hide=d.get("hide"),
            mounts=[Mount(*m) for m in d.get("mounts") or ()],
            tmpfs=d.get("tmpfs"),
            files=d.get("files"),
            parent=d.get("parent"),
        )


# -- the system calls ---------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(
        None if source is None else os.fsencode(source),
        os.fsencode(target),
        None if fstype is None else fstype.encode(),
        flags,
        None if data is None else data.encode(),
    )
    _check(result, f"mount {fstype or 'bind'} {source or ''} on {target}".replace("  ", " "))


def _prctl(option: int, arg: int = 0) -> int:
    return _libc.prctl(option, arg, 0, 0, 0)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def die_with_parent() -> None:
    """SIGKILL when the parent (the thread that forked this process) dies; kept across execve."""
    _check(_prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl(PR_SET_PDEATHSIG)")


# -- building the walls ---------------------------------------------------------------------------
def unshare_namespaces(sb: Sandbox) -> None:
    """Step one, in the process that will fork the sandbox's first process: new mount, PID and IPC
    namespaces (and, for ISOLATED_BY_USERNS, a user namespace mapping this uid and gid to
    themselves). The caller must be single-threaded; the PID namespace is its next child's."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
    if sb.mode == ISOLATED_BY_USERNS:
        uid, gid = os.geteuid(), os.getegid()
        unshare(flags | CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    else:
        unshare(flags)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        raise SandboxError(f"write {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


class _Mounts:
    """The mount namespace being built: which folders are ours (a tmpfs or a writable mount of
    this sandbox, where mount points may be made) and which become read-only at the end."""

    def __init__(self) -> None:
        self.ours: list[str] = []
        self.read_only_later: list[str] = []

    def is_ours(self, path: str) -> bool:
        return any(_under(path, p) for p in self.ours)

    def tmpfs(self, target: str, mode: str = "0755") -> None:
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
        self.ours.append(target)

    def graft(self, folder: str) -> None:
        """Make `folder` a tmpfs of ours holding what it held (each entry bound back, links
        copied), so that new entries can be made in it without touching the host."""
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = os.listdir(fd)
            self.tmpfs(folder)
            self.read_only_later.append(folder)
            for name in names:
                source, target = f"/proc/self/fd/{fd}/{name}", os.path.join(folder, name)
                st = os.lstat(source)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(source), target)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    os.mkdir(target)
                else:
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
                _mount(source, target, None, MS_BIND | MS_REC)
        finally:
            os.close(fd)

    def make_point(self, target: str, directory: bool) -> None:
        """An empty folder or file at `target`, made inside a folder of ours (grafting the nearest
        folder that exists when it is the host's)."""
        if os.path.lexists(target):
            return
        parent = os.path.dirname(target)
        missing = [target]
        while not os.path.lexists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise SandboxError(f"cannot make {target}: {parent} is not a folder")
        if not self.is_ours(parent):
            if parent == "/":
                raise SandboxError(f"cannot make {target}: {missing[-1]} would be made in /")
            self.graft(parent)
        for path in reversed(missing[1:]):
            os.mkdir(path, 0o755)
        if directory:
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))

    def bind(self, source_fd: int, target: str, writable: bool) -> None:
        directory = stat.S_ISDIR(os.fstat(source_fd).st_mode)
        self.make_point(target, directory)
        _mount(f"/proc/self/fd/{source_fd}", target, None, MS_BIND | MS_REC)
        if writable:
            self.ours.append(target)
        else:
            read_only(target)

    def finish(self) -> None:
        for target in self.read_only_later:
            read_only(target)


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def read_only(target: str) -> None:
    """Remount one mount read-only, keeping the flags a user namespace may not clear."""
    flags = os.statvfs(target).f_flag
    keep = 0
    for st_flag, ms_flag in (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    ):
        if flags & st_flag:
            keep |= ms_flag
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def enter(sb: Sandbox) -> None:
    """Step two, in the sandbox's first process (PID 1 of the namespaces `unshare_namespaces`
    made): build its file system, mount its /proc, chdir, and give up every privilege. After this
    the process may `execve` its program or import a handler; it cannot undo any of it."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    os.umask(0o022)  # mount points readable by the sandbox's uid, and a container's umask for its program
    sources = {}
    for m in sb.mounts:  # opened before anything is hidden: a source may lie in a hidden folder
        try:
            sources[m.target] = os.open(m.source, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"mount source {m.source}: {exc.strerror}") from None
    null = os.open("/dev/null", os.O_PATH | os.O_CLOEXEC)
    mounts = _Mounts()
    for target in sb.tmpfs:
        if os.path.isdir(target):
            mounts.tmpfs(target, "1777")
    # a folder of the host's that lacks a mount point (/var for /var/openfaas) is remade first: its
    # entries are bound back from the host, so what is hidden inside it must be hidden afterwards
    private = [p for p in sb.hide] + [m.target for m in sb.mounts if m.writable]
    for m in sb.mounts:
        folder = _nearest_existing(m.target)
        if folder != m.target and folder != "/" and not any(_under(folder, p) for p in private):
            if not mounts.is_ours(folder):
                mounts.graft(folder)
    # then outer paths first, a hidden path before what is mounted at or inside it: a private /tmp
    # covers a state folder under /tmp (gone then), an image comes back inside a hidden state
    # folder, and a state folder inside a checkout that comes back read-only is hidden again
    steps: list[tuple[str, Mount | None]] = [(p, None) for p in sb.hide] + [(m.target, m) for m in sb.mounts]
    for path, mount in sorted(steps, key=lambda step: (_depth(step[0]), step[1] is not None)):
        if mount is not None:
            mounts.bind(sources[mount.target], mount.target, mount.writable)
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue  # gone already (under a private /tmp), or never there
        if stat.S_ISDIR(st.st_mode):
            mounts.tmpfs(path)
            mounts.read_only_later.append(path)
        else:
            _mount(f"/proc/self/fd/{null}", path, None, MS_BIND)
    mounts.finish()
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SandboxError:
        raise SandboxError(
            "mount proc on /proc: not allowed here (a /proc partly covered, as in a container?)"
        ) from None
    for fd in [*sources.values(), null]:
        os.close(fd)
    os.chdir(sb.cwd)
    drop_privileges(sb)


def drop_privileges(sb: Sandbox) -> None:
    """No capability now or after any execve (bounding and ambient sets emptied, no_new_privs),
    and, for ISOLATED_BY_UID, the function's uid and gid with no supplementary groups. Then the
    death signal again: changing credentials clears it."""
    for cap in range(_LAST_CAP + 1):
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if sb.mode == ISOLATED_BY_UID:
        if sb.uid is None or sb.gid is None or sb.uid == 0 or sb.gid == 0:
            raise SandboxError("an unprivileged uid and gid are required")
        os.setgroups([])
        os.setresgid(sb.gid, sb.gid, sb.gid)
        os.setresuid(sb.uid, sb.uid, sb.uid)
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
    die_with_parent()


# -- the launcher -------------------------------------------------------------------------------
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def open_files(sb: Sandbox) -> dict[int, int]:
    """Open `files` with the launcher's privileges and view of the host, before any wall is up
    (the sandbox's uid may not open them; its mount namespace may not have them): number -> fd."""
    opened = {}
    for number, path in sb.files.items():
        try:
            opened[number] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SandboxError(f"open {path}: {exc.strerror}") from None
    return opened


def _exec(sb: Sandbox, opened: dict[int, int]) -> None:
    """Become the program, the opened files at their numbers (inheritable; every other descriptor
    of the launcher's is close-on-exec)."""
    for number, fd in opened.items():
        if fd == number:
            os.set_inheritable(fd, True)
        else:
            os.dup2(fd, number)
    os.execve(sb.argv[0], sb.argv, sb.env)


def _child(sb: Sandbox, alive: int, opened: dict[int, int]) -> None:
    """PID 1 of the sandbox: build it, then become the program. `alive`: the read end of a pipe
    whose writer is the launcher, which may have died before the death signal was set."""
    try:
        enter(sb)
        if select.select([alive], [], [], 0)[0]:  # EOF: the launcher is gone
            os._exit(1)
        os.close(alive)
        _exec(sb, opened)
    except BaseException as exc:  # noqa: BLE001 — anything: say it on the function's log, exit
        os.write(2, f"faas-gpu sandbox: {exc}\n".encode(errors="replace"))
        os._exit(126)


def launch(sb: Sandbox) -> int:
    """Run `sb`: this process dies with `sb.parent`; with namespaces it forks the sandbox's first
    process, relays signals to it and exits as it exits; without, it becomes the program."""
    if sb.parent is not None:
        die_with_parent()
        if os.getppid() != sb.parent:  # the parent died before the death signal was set
            return 1
    opened = open_files(sb)
    if not sb.namespaces:
        os.chdir(sb.cwd)
        _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
        _exec(sb, opened)
    unshare_namespaces(sb)
    alive, keep = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(keep)
        _child(sb, alive, opened)
    os.close(alive)
    for sig in RELAYED:
        signal.signal(sig, lambda signum, _frame: _relay(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            return 1
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def _relay(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def probe(sb: Sandbox, timeout_s: float = 30.0) -> str | None:
    """Run `sb` (a short program, e.g. `python -c pass`) through the launcher: None when it ran and
    exited 0, else why not (the launcher's words)."""
    import subprocess

    try:
        done = subprocess.run(launcher_argv(), input=sb.encode(), capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
    return said[-1].removeprefix("faas-gpu sandbox: ") if said else f"exit status {done.returncode}"


LAUNCHER = os.path.abspath(__file__)
"""The launcher's script (this file): how a process is known for a replica's launcher by its
command line (what a restarted provider or `faas-gpu down` kills)."""


def launcher_argv() -> list[str]:
    """The launcher's command line: the stack's interpreter without site (-S) or environment
    (-I), this file; the `Sandbox` goes on its stdin."""
    return [sys.executable, "-I", "-S", LAUNCHER]


def main() -> int:
    raw = sys.stdin.buffer.read()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        return launch(Sandbox.decode(raw))
    except (SandboxError, OSError, ValueError, KeyError) as exc:
        os.write(2, f"faas-gpu sandbox: {exc}\n".encode(errors="replace"))
        return 126


# -- each function's uid ----------------------------------------------------------------------------
class UidTable:
    """Each function's own uid, the same across restarts: the first free uid from a hash of the
    function's key (`namespace/name`) on, kept in a JSON file (the state folder's). Free: no other
    function has it, no user of this host has it, and no subordinate-id range (/etc/subuid,
    /etc/subgid: other users' containers) holds it."""

    def __init__(self, path: str | os.PathLike, first: int = FIRST_UID, count: int = UID_COUNT):
        import threading

        self.path, self.first, self.count = os.fspath(path), first, count
        self._lock = threading.Lock()
        self._table: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        import json

        if self._table is None:
            try:
                with open(self.path) as fh:
                    loaded = json.load(fh)
                self._table = {str(k): int(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
            except (OSError, ValueError, TypeError):
                self._table = {}
        return self._table

    def uid(self, key: str) -> int:
        import hashlib
        import json

        with self._lock:
            table = self._load()
            if key in table:
                return table[key]
            taken = set(table.values())
            reserved = _subordinate_ranges()
            start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % self.count
            for step in range(self.count):
                uid = self.first + (start + step) % self.count
                if uid not in taken and not _is_user(uid) and not any(lo <= uid < hi for lo, hi in reserved):
                    break
            else:
                raise SandboxError(f"no free uid left in {self.first}..{self.first + self.count - 1}")
            table[key] = uid
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(table, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            return uid


def _is_user(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _subordinate_ranges() -> list[tuple[int, int]]:
    out = []
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                out.append((int(parts[1]), int(parts[1]) + int(parts[2])))
    return out


if __name__ == "__main__":
    sys.exit(main())
