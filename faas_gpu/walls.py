"""Walls around a child process that runs what nobody vouched for, entered by the child itself.

A GPU Manager's model worker parses and runs uploaded artifacts; the checks of
`faas_gpu.models` say what may be loaded, and these walls say what a loader bug would gain: the
child gets an unprivileged identity, a network of its own with nothing in it, a read-only view
of the filesystem in which the folders it must not see (the state folder: secrets, datastore,
logs) are empty, a private scratch as the only place it writes, `no_new_privs`, no capabilities,
a seccomp filter, a clean environment, and it is not dumpable (other processes of its uid cannot
read its memory). As bubblewrap builds them for a plain process, but with no extra exec: the
child calls `enter(walls)` first thing, while it is still single-threaded (a namespace joined by
one thread of many is that thread's alone), through libc (`unshare`, `mount`, `prctl`: Python
3.11 has no `os.unshare`). A `multiprocessing` spawn child is single-threaded until it imports
torch, and its pipe to the parent, the descriptors passed over it (a memory file) and its
standard streams keep working: none of them goes through the network or a path.

How, by who the parent is:

- **root**: new mount, network and IPC namespaces, then `setresuid`/`setresgid` to `Walls.uid`
  and `gid` (which drops every capability), after the bounding set is emptied.
- **not root**: the same namespaces inside a new user namespace that maps the parent's uid to
  itself (no other uid is needed), where the child holds capabilities only long enough to mount,
  then drops them all. Kernels or policies that refuse unprivileged user namespaces (Ubuntu's
  AppArmor, `kernel.unprivileged_userns_clone=0`, a container's seccomp profile) leave only the
  walls that need no privilege (`no_new_privs`, seccomp, the environment); `enter` says what is
  missing (`Isolation.missing`), and `Walls.required` turns that into an error.

The view of the filesystem: the whole tree remounted read-only and nosuid (device nodes stay
usable: a read-only mount refuses writes to files, not to devices, so /dev/nvidia* work), each
`hide` folder covered by an empty read-only tmpfs, each `scratch` folder a private tmpfs (the
only writable places, with `writable` paths), and the `read_only` and `writable` paths that a
cover hid bound back at their own paths. A folder on the way to one of those that the child's
uid could not traverse (pytest's 0700 tmp folder, /root) is covered too and the path rebuilt
inside, so nothing but that path shows. /proc is mounted again with `hidepid=invisible`: the
child sees no other uid's processes (not their command lines either).

Reusable: nothing here knows of models; the GPU Manager's walls are `gpu_manager/isolation.py`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x10000000, 0x40000000, 0x08000000
CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWCGROUP = 0x04000000, 0x20000000, 0x02000000
NEW_NAMESPACES = (
    CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID | CLONE_NEWCGROUP
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18,
)  # fmt: skip
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 4, 24, 38, 22
SECCOMP_MODE_FILTER = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (the generic table's)
O_PATH = getattr(os, "O_PATH", 0o10000000)


class SandboxError(RuntimeError):
    """The walls could not be built (and `Walls.required` says a child may not run without them)."""


@dataclass(frozen=True)
class Walls:
    """What a child may see and do. Paths are absolute; each is resolved (links followed) first."""

    uid: int | None = None  # a root parent's child runs as this uid and gid (None: keep them)
    gid: int | None = None
    hide: tuple[str, ...] = ()  # folders the child finds empty
    read_only: tuple[str, ...] = ()  # paths it must still read (code, the model store): shown again
    writable: tuple[str, ...] = ()  # paths it must write (an MPS pipe folder)
    scratch: tuple[str, ...] = ("/tmp", "/dev/shm")  # private tmpfs each: its only other writes
    scratch_mb: int = 256
    network: bool = False  # True: keep the parent's network namespace
    ipc: bool = False  # True: keep the parent's IPC namespace (MPS shares memory through it)
    keep_env: tuple[str, ...] = ("PATH", "LANG", "LANGUAGE", "TZ", "LC_")  # names, or prefixes ending in _
    set_env: tuple[tuple[str, str], ...] = ()
    seccomp: bool = True
    required: bool = False  # True: SandboxError rather than a child with fewer walls


@dataclass(frozen=True)
class Isolation:
    """What `enter` built: the child's identity, its namespaces, and the walls it could not build."""

    uid: int
    gid: int
    namespaces: tuple[str, ...] = ()
    no_new_privs: bool = False
    seccomp: bool = False
    missing: tuple[str, ...] = field(default_factory=tuple)

    @property
    def isolated(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        walls = f"uid {self.uid}, namespaces {'+'.join(self.namespaces) or 'none'}"
        walls += ", no_new_privs" if self.no_new_privs else ""
        walls += ", seccomp" if self.seccomp else ""
        return walls + (f"; missing: {'; '.join(self.missing)}" if self.missing else "")


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


# -- the view of the filesystem ----------------------------------------------------------------------
def _under(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


def _traversable(path: str, uid: int, gid: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    mode = st.st_mode
    if st.st_uid == uid:
        return bool(mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def plan(walls: Walls, uid: int, gid: int) -> tuple[list[str], list[tuple[str, bool]]]:
    """(covers, binds): the folders to cover with an empty tmpfs (hidden ones, scratch, and any
    folder `uid` could not traverse on the way to a kept path), and the kept paths to bind back
    because a cover hides them or they must stay writable (path, writable). Pure but for the
    stats of the kept paths."""
    covers = [os.path.realpath(p) for p in (*walls.hide, *walls.scratch) if os.path.isdir(p)]
    kept = [(os.path.realpath(p), False) for p in walls.read_only]
    kept += [(os.path.realpath(p), True) for p in walls.writable]
    kept = [(p, w) for p, w in kept if os.path.exists(p)]
    for path, _ in kept:
        parts = path.split("/")  # "", "a", "b", ...: string work (pathlib's first use costs ms here)
        for depth in range(2, len(parts)):
            folder = "/".join(parts[:depth])
            if any(_under(folder, c) for c in covers):
                break  # rebuilt inside a cover: traversable
            if not _traversable(folder, uid, gid):
                covers.append(folder)
                break
    # hidden by a cover: shown again; writable: bound onto itself, to be writable in a read-only tree
    binds = [(p, w) for p, w in kept if w or any(_under(p, c) and p != c for c in covers)]
    return covers, binds


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _make_mountpoint(path: str, is_dir: bool) -> None:
    """A mount point inside a cover (a tmpfs of ours: nothing on the host is touched), each folder
    on the way 0755 whatever the parent's umask (a daemon's is 077: the child could not cross it)."""
    old = os.umask(0o022)
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if is_dir:
            os.makedirs(path, mode=0o755, exist_ok=True)
        elif not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    finally:
        os.umask(old)


def _kept_flags(path: str) -> int:
    """The flags a remount of `path` must repeat (a user namespace may not drop them: locked)."""
    f = os.statvfs(path).f_flag
    flags = MS_NODEV if f & os.ST_NODEV else 0
    flags |= MS_NOEXEC if f & os.ST_NOEXEC else 0
    flags |= MS_NOATIME if f & os.ST_NOATIME else 0
    flags |= MS_NODIRATIME if f & os.ST_NODIRATIME else 0
    return flags | (MS_RELATIME if f & getattr(os, "ST_RELATIME", 4096) else 0)


def _remount(path: str, read_only: bool = True) -> None:
    ro = MS_RDONLY if read_only else 0
    _mount(None, path, None, MS_REMOUNT | MS_BIND | ro | MS_NOSUID | _kept_flags(path))


def _read_only_tree() -> None:
    """Every mount read-only and nosuid, recursively (mount_setattr; else one by one)."""
    attr = struct.pack("<QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    if _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, buf, ctypes.c_size_t(len(attr))) == 0:
        return
    if ctypes.get_errno() != errno.ENOSYS:
        _check(-1, "mount_setattr /")
    with open("/proc/self/mountinfo") as fh:  # kernels before 5.12
        points = [line.split()[4].encode().decode("unicode_escape") for line in fh]
    for point in sorted(set(points), key=_depth):
        try:
            _remount(point)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EINVAL):
                raise


def _build_view(walls: Walls, covers: list[str], binds: list[tuple[str, bool]]) -> None:
    """In a new mount namespace: private, read-only, then the covers and binds of `plan`, the
    shallowest first (a cover beneath a bound path hides again what the bind showed)."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the parent's namespace
    # the kept paths, held before anything covers them (a bind's source must be in this namespace)
    fds = {path: os.open(path, O_PATH | os.O_CLOEXEC) for path, _ in binds}
    try:
        _read_only_tree()
        scratch = {os.path.realpath(p) for p in walls.scratch}
        writable = dict(binds)
        ops = sorted([(c, "cover") for c in covers] + [(b, "bind") for b, _ in binds], key=lambda op: _depth(op[0]))
        done: list[tuple[str, str]] = []
        for path, kind in ops:
            above = [op for op in done if _under(path, op[0]) and path != op[0]]
            under = max(above, key=lambda op: _depth(op[0]))[1] if above else None  # the nearest: cover or bind
            if kind == "cover":
                if under == "cover":
                    continue  # hidden already
                mode, size = ("1777", walls.scratch_mb) if path in scratch else ("0755", 1)
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={size}m")
            else:
                if under == "cover":  # rebuilt inside our tmpfs (never on the host's files)
                    _make_mountpoint(path, os.path.isdir(f"/proc/self/fd/{fds[path]}"))
                _mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
            done.append((path, kind))
        for path, kind in done:  # built: hidden folders read-only, kept paths as asked, scratch writable
            if kind == "cover" and path not in scratch:
                _remount(path)
            elif kind == "bind":
                _remount(path, read_only=not writable[path])
    finally:
        for fd in fds.values():
            os.close(fd)
    try:  # other uids' processes out of sight (not possible in a user namespace: /proc stays as it is)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "hidepid=invisible")
    except OSError:
        pass


# -- identity, privileges, seccomp, environment ----------------------------------------------------
def _drop_bounding_set() -> bool:
    """Every capability out of the bounding set; False where this process may not (no
    CAP_SETPCAP: a container's root), which `no_new_privs` and empty sets make up for."""
    cap = 0
    while True:
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) == -1:
            err = ctypes.get_errno()
            if err == errno.EINVAL:
                return True  # past the last capability this kernel knows
            if err == errno.EPERM:
                return False
            _check(-1, f"drop capability {cap}")
        cap += 1


def _drop_capabilities() -> None:
    """No capability left in any set (a user namespace's uid keeps them through setresuid)."""
    header = struct.pack("<Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two {effective, permitted, inheritable} structures, all zero
    _check(_libc.capset(header, data), "capset")


def _seccomp_filter() -> bytes | None:
    """A classic BPF program that answers EPERM to syscalls a model never needs and that widen
    the kernel's attack surface or reach other processes (ptrace, process_vm_*, namespaces and
    mounts, keyrings, bpf, perf, userfaultfd, io_uring, module and kexec loading, clock and host
    settings), refuses new namespaces through clone, and makes clone3 unknown (glibc then uses
    clone). x86-64 only (numbers differ by architecture; None elsewhere): a syscall of another ABI
    (i386 through int 0x80, x32) is refused whole."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    denied = [
        101, 310, 311,  # ptrace, process_vm_readv, process_vm_writev
        165, 166, 155, 272, 308, 428, 429, 430, 431, 432, 433, 442,  # mounts, unshare, setns, new mount API
        248, 249, 250, 321, 298, 323, 425, 426, 427,  # keyrings, bpf, perf, userfaultfd, io_uring
        246, 320, 175, 313, 176, 303, 304, 172, 173,  # kexec, modules, handles, iopl/ioperm
        167, 168, 169, 163, 164, 227, 159,  # swap, reboot, acct, clocks
        170, 171, 179, 135, 161,  # host names, quota, personality, chroot
    ]  # fmt: skip
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS  # SECCOMP_RET_ERRNO
    allow, audit_x86_64 = 0x7FFF0000, 0xC000003E
    ld, jeq, jset, ret, ldabs, k = 0x00, 0x15, 0x45, 0x06, 0x20, 0x00  # BPF_LD|W|ABS, JMP|JEQ|K, ...
    prog: list[tuple[int, int, int, int]] = [
        (ld | ldabs, 0, 0, 4),  # arch
        (jeq | k, 1, 0, audit_x86_64),
        (ret, 0, 0, eperm),
        (ld | ldabs, 0, 0, 0),  # nr
        (0x35, 0, 1, 0x40000000),  # JGE x32 bit
        (ret, 0, 0, eperm),
    ]
    for nr in denied:
        prog += [(jeq | k, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [
        (jeq | k, 0, 1, 435),  # clone3
        (ret, 0, 0, enosys),
        (jeq | k, 0, 3, 56),  # clone: its flags
        (ld | ldabs, 0, 0, 16),  # args[0], low half
        (jset | k, 0, 1, NEW_NAMESPACES),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]  # fmt: skip
    return b"".join(struct.pack("<HBBI", *insn) for insn in prog)


def _install_seccomp(program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("<HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    arg = ctypes.c_char_p(fprog)
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), arg, 0, 0), "seccomp")


def _clean_environment(walls: Walls, home: str) -> None:
    """Only the names `keep_env` allows, HOME and TMPDIR in the scratch; and the bytes the
    process's environment started as (what /proc/self/environ shows) zeroed."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if any(k == n or (n.endswith("_") and k.startswith(n)) for n in walls.keep_env)
    }
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        env_start, env_end = int(fields[47]), int(fields[48])  # fields 50 and 51 of stat(5)
    except (OSError, ValueError, IndexError):
        env_start = env_end = 0
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update({"HOME": home, "TMPDIR": home, "USER": "sandbox", "LOGNAME": "sandbox", **dict(walls.set_env)})
    if 0 < env_start < env_end:
        ctypes.memset(env_start, 0, env_end - env_start)


# -- entering ----------------------------------------------------------------------------------------
def enter(walls: Walls) -> Isolation:
    """Build the walls around this process (see the module's docstring); call it before anything
    untrusted is read, while the process is single-threaded. Returns what was built."""
    if len(os.listdir("/proc/self/task")) != 1:
        raise SandboxError("sandbox: entered by a process that already runs threads")
    uid, gid = os.getuid(), os.getgid()
    root = os.geteuid() == 0
    target_uid = walls.uid if root and walls.uid is not None else uid
    target_gid = walls.gid if root and walls.gid is not None else gid
    missing: list[str] = []
    flags = CLONE_NEWNS | (0 if walls.network else CLONE_NEWNET) | (0 if walls.ipc else CLONE_NEWIPC)
    names = ["mnt"] + ([] if walls.network else ["net"]) + ([] if walls.ipc else ["ipc"])
    covers, binds = plan(walls, target_uid, target_gid)
    try:
        _check(_libc.unshare(flags if root else flags | CLONE_NEWUSER), "unshare")
    except OSError as exc:
        if walls.required:
            raise SandboxError(f"sandbox: no namespaces ({exc})") from exc
        names = []
        missing.append(
            f"namespaces refused ({exc.strerror}): the network, the state folder and the files are the parent's"
        )
    if names and not root:
        names.insert(0, "user")
        try:  # the parent's uid and gid, mapped to themselves: no other is needed
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError as exc:
            raise SandboxError(f"sandbox: the user namespace's maps were refused ({exc})") from exc
    if names:
        try:
            _build_view(walls, covers, binds)
        except OSError as exc:  # half a view is no view: never run on it
            raise SandboxError(f"sandbox: the filesystem view failed ({exc})") from exc
    change_uid = root and walls.uid is not None and walls.uid != 0
    if change_uid and not names and walls.read_only:
        # without a mount namespace nothing can show the kept paths to another uid (a private state
        # folder's model store): the child keeps root's uid, without its capabilities
        change_uid = False
        missing.append("the uid stays root (no mount namespace to show it the paths it must read)")
    elif root and walls.uid == 0:
        missing.append("the uid stays root")
    if (root or names) and not _drop_bounding_set():
        missing.append("the capability bounding set stays (no CAP_SETPCAP)")
    try:
        if change_uid and walls.gid is not None:
            os.setgroups([])
            os.setresgid(target_gid, target_gid, target_gid)
        if change_uid:
            os.setresuid(target_uid, target_uid, target_uid)  # from root: every capability goes
    except OSError as exc:
        raise SandboxError(f"sandbox: could not become uid {target_uid} ({exc})") from exc
    if (names and not root) or (root and not change_uid):
        _drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_DUMPABLE, 0)
    seccomp = False
    program = _seccomp_filter() if walls.seccomp else None
    if program is not None:
        _install_seccomp(program)
        seccomp = True
    elif walls.seccomp:
        missing.append(f"no seccomp filter for {platform.machine()}")
    scratch = os.path.realpath(walls.scratch[0]) if walls.scratch and names else "/"
    os.chdir(scratch)
    _clean_environment(walls, scratch)
    if walls.required and missing:
        raise SandboxError(f"sandbox: {'; '.join(missing)}")
    return Isolation(os.getuid(), os.getgid(), tuple(names), True, seccomp, tuple(missing))


def _probe_child(conn, walls: Walls) -> None:
    try:
        conn.send(("ok", enter(walls)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def probe(walls: Walls, timeout_s: float = 60) -> Isolation:
    """What `enter(walls)` builds on this machine, tried in a throwaway child (spawned, as the
    workers are): SandboxError when it cannot be entered at all."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_probe_child, args=(child, walls), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise SandboxError("sandbox: the probe did not answer")
        kind, value = parent.recv()
    except EOFError:
        raise SandboxError(f"sandbox: the probe died (exit {proc.exitcode})") from None
    finally:
        parent.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    if kind != "ok":
        raise SandboxError(value)
    return value
