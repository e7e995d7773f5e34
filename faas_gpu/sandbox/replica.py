"""A replica's walls: what a tenant's code runs inside on a host it shares with the stack.

Why: a function runs its user's code. Beside the daemons as the same user it read the admin
password, the cluster token, every function's token and the datastore from the state folder, and
the provider's environment from /proc (issue 41). faasd runs each function as a containerd task in
namespaces of its own; a plain process gets the same walls here, built from Linux namespaces with
no helper program (the design of bubblewrap, in Python):

- its own **mount namespace**, where every mount is read-only and nosuid, the paths in `hide` do
  not exist (an empty read-only tmpfs over a folder, /dev/null over a file: the state folder, the
  stack user's home and config), and only `mounts` come back in, each at a path of its choosing
  (for a replica: its built image read-only, its own secrets read-only at OpenFaaS's
  /var/openfaas/secrets, its token, a private /tmp, /var/tmp and HOME, writable:
  `faas_gpu.contract.replica`); the `tmpfs` folders (/dev/shm) and the writable mounts are the
  only places it writes;
- its own **PID namespace** with its own /proc: it sees its own processes only, and when its first
  process (the watchdog) exits the kernel kills every process it left behind;
- its own **IPC namespace** (System V IPC and POSIX message queues of its own) and /dev/shm;
- an **unprivileged uid of its function's own** (`uids.UidTable`) when the stack runs as root;
  where the stack runs as a user, a **user namespace** mapping that user to itself gives the
  same walls without privilege (the replica then has the stack user's uid and groups, and can
  neither read the folders hidden from it nor write the ones it can see);
- no capabilities (bounding, ambient, effective and permitted sets emptied), `no_new_privs`, a
  **seccomp filter** refusing what no function needs and what reaches other processes or widens
  the kernel's surface (ptrace, process_vm_*, mounts and namespaces, keyrings, bpf, perf,
  userfaultfd, io_uring, modules, kexec: `primitives.DENIED_SYSCALLS_X86_64`; kept across
  execve, for the watchdog and everything it runs), not dumpable (until its execve, which resets
  it), and exactly `env` as its environment;
- it dies with the process that made it (`PR_SET_PDEATHSIG`).
The host network stays: the gateway reaches a replica on 127.0.0.1:<port> and the replica reaches
the scheduler and the GPU Managers with its function's token, as in faasd's host-network mode.

How, in two steps, each callable from a process that is single-threaded (a forked child is):
`unshare_namespaces(sb)` in the process that will fork the sandbox's first process, then
`enter(sb)` in that first process (PID 1 of the new PID namespace), after which it may `execve`
its program (the launcher, `launcher.py`, per replica) or import a handler and serve (issue 44: a
replica forked from a template process: fork, `unshare_namespaces`, fork again, `enter` in the
grandchild, import the handler; nothing of the template's environment is left, and the
template's own process keeps none of these walls).

`Sandbox` is the whole description: plain data, so the launcher can take it on its stdin.
"""

from __future__ import annotations

import marshal
import os
import stat

from faas_gpu.sandbox import primitives as p
from faas_gpu.sandbox.primitives import SandboxError

ISOLATED_BY_UID = "uid"
"""The stack runs as root: namespaces, and the function's own uid."""
ISOLATED_BY_USERNS = "userns"
"""The stack runs as a user: namespaces inside a user namespace, the stack user's uid."""
NOT_ISOLATED = "none"


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
    same namespaces inside a user namespace) or NOT_ISOLATED (a clean environment, `no_new_privs`
    and dying with the parent only). `hide`: paths that do not exist inside. `mounts`: bound in;
    with the hidden paths, outer paths first (a mount may lie inside a hidden or a private folder:
    an image inside the hidden state folder; a hidden path inside a mount stays hidden).
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
        self.hide = [str(path) for path in hide or ()]
        self.mounts = list(mounts or ())
        self.tmpfs = [str(path) for path in tmpfs or ()]
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


# -- step one ----------------------------------------------------------------------------------------
def unshare_namespaces(sb: Sandbox) -> None:
    """Step one, in the process that will fork the sandbox's first process: new mount, PID and IPC
    namespaces (and, for ISOLATED_BY_USERNS, a user namespace mapping this uid and gid to
    themselves). The PID namespace is this process's next child's; this process stays in its own."""
    if not p.single_threaded():
        raise SandboxError("namespaces: the process runs threads (unshare it before any starts)")
    flags = p.CLONE_NEWNS | p.CLONE_NEWPID | p.CLONE_NEWIPC
    if sb.mode == ISOLATED_BY_USERNS:
        uid, gid = os.geteuid(), os.getegid()
        p.unshare(flags | p.CLONE_NEWUSER)
        p.map_user_namespace(uid, gid)
    else:
        p.unshare(flags)


# -- step two ----------------------------------------------------------------------------------------
class _Mounts:
    """The mount namespace being built: which folders are ours (a tmpfs or a writable mount of
    this sandbox, where mount points may be made) and which become read-only at the end."""

    def __init__(self) -> None:
        self.ours: list[str] = []
        self.read_only_later: list[str] = []

    def is_ours(self, path: str) -> bool:
        return any(p.under(path, folder) for folder in self.ours)

    def tmpfs(self, target: str, mode: str = "0755") -> None:
        p.tmpfs(target, mode)
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
                p.mount(source, target, None, p.MS_BIND | p.MS_REC)  # read-only, as the tree is
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
        """`source_fd`'s file or folder at `target`: read-only, or writable (a bind inherits the
        read-only tree's flags: made writable again, that mount alone)."""
        directory = stat.S_ISDIR(os.fstat(source_fd).st_mode)
        self.make_point(target, directory)
        p.mount(f"/proc/self/fd/{source_fd}", target, None, p.MS_BIND | p.MS_REC)
        p.remount(target, read_only=not writable)
        if writable:
            self.ours.append(target)

    def finish(self) -> None:
        for target in self.read_only_later:
            p.remount(target)


def enter(sb: Sandbox) -> None:
    """Step two, in the sandbox's first process (PID 1 of the namespaces `unshare_namespaces`
    made), single-threaded: build its file system (read-only, then what is hidden and what comes
    back), mount its /proc, chdir, give up every privilege and install the seccomp filter, and
    replace the environment with `sb.env`. After this the process may `execve` its program or
    import a handler; it cannot undo any of it. SandboxError or OSError: nothing may run."""
    if not p.single_threaded():
        raise SandboxError("sandbox: entered by a process that already runs threads")
    p.private_root()
    os.umask(0o022)  # mount points readable by the sandbox's uid, and a container's umask for its program
    sources = {}
    for m in sb.mounts:  # opened before anything is hidden: a source may lie in a hidden folder
        try:
            sources[m.target] = os.open(m.source, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"mount source {m.source}: {exc.strerror}") from None
    null = os.open("/dev/null", os.O_PATH | os.O_CLOEXEC)
    p.read_only_tree()  # what the sandbox writes is its own: the tmpfs folders and writable mounts below
    mounts = _Mounts()
    for target in sb.tmpfs:
        if os.path.isdir(target):
            mounts.tmpfs(target, "1777")
    # a folder of the host's that lacks a mount point (/var for /var/openfaas) is remade first: its
    # entries are bound back from the host, so what is hidden inside it must be hidden afterwards
    private = [*sb.hide, *(m.target for m in sb.mounts if m.writable)]
    for m in sb.mounts:
        folder = p.nearest_existing(m.target)
        if folder != m.target and folder != "/" and not any(p.under(folder, h) for h in private):
            if not mounts.is_ours(folder):
                mounts.graft(folder)
    # then outer paths first, a hidden path before what is mounted at or inside it: a private /tmp
    # covers a state folder under /tmp (gone then), an image comes back inside a hidden state
    # folder, and a state folder inside a checkout that comes back read-only is hidden again
    steps: list[tuple[str, Mount | None]] = [(h, None) for h in sb.hide] + [(m.target, m) for m in sb.mounts]
    for path, mount in sorted(steps, key=lambda step: (p.depth(step[0]), step[1] is not None)):
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
            p.mount(f"/proc/self/fd/{null}", path, None, p.MS_BIND)
    mounts.finish()
    try:
        p.mount_proc()
    except OSError:
        raise SandboxError(
            "mount proc on /proc: not allowed here (a /proc partly covered, as in a container?)"
        ) from None
    for fd in [*sources.values(), null]:
        os.close(fd)
    os.chdir(sb.cwd)
    drop_privileges(sb)
    p.replace_environment(sb.env)


def drop_privileges(sb: Sandbox) -> None:
    """No capability now or after any execve (every set emptied, `no_new_privs`), for
    ISOLATED_BY_UID the function's uid and gid with no supplementary groups, not dumpable, the
    death signal again (changing credentials clears it), and last the seccomp filter (which
    refuses the mounts and namespaces built before it)."""
    p.drop_bounding_set()  # False (a root without CAP_SETPCAP): no_new_privs and the uid make up for it
    if sb.mode == ISOLATED_BY_UID:
        if sb.uid is None or sb.gid is None:
            raise SandboxError("an unprivileged uid and gid are required")
        p.become(sb.uid, sb.gid)
    p.drop_capabilities()
    p.no_new_privs()
    p.not_dumpable()
    p.die_with_parent()
    program = p.seccomp_filter()
    if program is not None:
        p.install_seccomp(program)
