"""The pieces every wall of faas-gpu is built from, once each: Linux's system calls through libc
(Python 3.11 has no `os.unshare` nor `mount`), capabilities, the seccomp filter, mounts and a
read-only tree, dropping privileges, a clean environment, and the path helpers they need.

Why one place: a replica's walls (`replica`) and a model worker's (`worker`) are different
policies over the same mechanism; a fix to a piece (a flag a user namespace locks, a syscall the
filter misses) is then made for both. Standard library only, and only what starts fast
(`ctypes`, `struct`: no `platform`, `pathlib` or `dataclasses`): the replica's launcher imports
this before every replica's start (`python -I -S`, no site packages).

Every call that fails raises SyscallError (an OSError) naming the step (`check`); `SandboxError`
is for a sandbox that cannot be built as described. The caller must be single-threaded where a
step says so: a namespace or a uid taken by one thread of many is that thread's alone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import struct

# -- Linux's numbers (uapi/linux/sched.h, mount.h, prctl.h, capability.h, seccomp.h) ---------------
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NEW_NAMESPACES = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 3, 4, 22
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
SECCOMP_MODE_FILTER = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (the generic table's)
_CAPABILITY_VERSION_3 = 0x20080522


class SandboxError(Exception):
    """The sandbox could not be built as described; the message names the step and the path."""


class SyscallError(OSError):
    """A system call refused, with its errno; said as the step and the reason, e.g.
    `unshare: Operation not permitted` (what `faas-gpu up` shows when functions are not isolated)."""

    def __str__(self) -> str:
        return str(self.strerror)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


_libc.capset.argtypes = (ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData))


def check(result: int, what: str) -> int:
    """`result` of a libc call, or SyscallError (an OSError) naming `what` when it is -1."""
    if result == -1:
        err = ctypes.get_errno()
        raise SyscallError(err, f"{what}: {os.strerror(err)}")
    return result


# -- the system calls --------------------------------------------------------------------------------
def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731 — paths may be any bytes
    check(
        _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
        f"mount {fstype or 'bind'} {source or ''} on {target}".replace("  ", " "),
    )


def prctl(option: int, arg: int = 0) -> int:
    """prctl as it answers: -1 and errno on failure (`check` it, or read the errno)."""
    return _libc.prctl(option, arg, 0, 0, 0)


def unshare(flags: int) -> None:
    check(_libc.unshare(flags), "unshare")


def single_threaded() -> bool:
    """Whether this process runs one thread (a fork's child does, whatever its parent ran)."""
    return len(os.listdir("/proc/self/task")) == 1


def write_file(path: str, text: str) -> None:
    """One write of `text` to a file of /proc (a map, a setting): OSError naming the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        raise SyscallError(exc.errno, f"write {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def map_user_namespace(uid: int, gid: int) -> None:
    """In a user namespace just made: `uid` and `gid` (the caller's outside) mapped to themselves,
    no other, and setgroups refused (an unprivileged map requires it)."""
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1")


# -- mounts ------------------------------------------------------------------------------------------
def private_root() -> None:
    """Nothing mounted from here on reaches the namespace this one was copied from."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def kept_flags(path: str) -> int:
    """The flags a remount of `path` must repeat: a user namespace may not clear them (locked)."""
    f = os.statvfs(path).f_flag
    flags = MS_NODEV if f & os.ST_NODEV else 0
    flags |= MS_NOEXEC if f & os.ST_NOEXEC else 0
    flags |= MS_NOATIME if f & os.ST_NOATIME else 0
    flags |= MS_NODIRATIME if f & os.ST_NODIRATIME else 0
    return flags | (MS_RELATIME if f & os.ST_RELATIME else 0)


def remount(path: str, read_only: bool = True) -> None:
    """One mount (a bind of ours, a tmpfs) made read-only or writable again, always nosuid."""
    ro = MS_RDONLY if read_only else 0
    mount(None, path, None, MS_REMOUNT | MS_BIND | ro | MS_NOSUID | kept_flags(path))


def read_only_tree() -> None:
    """Every mount of this (new, private) mount namespace read-only and nosuid, recursively, in
    one `mount_setattr`; mounts made afterwards (a tmpfs, a bind then `remount`ed writable) are
    the only places left to write. Device nodes stay usable: a read-only mount refuses writes
    to files, not to devices (/dev/null, /dev/nvidia*)."""
    attr = struct.pack("<QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    if _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, buf, ctypes.c_size_t(len(attr))) == 0:
        return
    if ctypes.get_errno() != errno.ENOSYS:
        check(-1, "mount_setattr /")
    with open("/proc/self/mountinfo") as fh:  # kernels before 5.12: one by one, outer first
        points = [line.split()[4].encode().decode("unicode_escape") for line in fh]
    for point in sorted(set(points), key=depth):
        try:
            remount(point)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EINVAL):
                raise


def tmpfs(target: str, mode: str = "0755", size_mb: int | None = None) -> None:
    """An empty private tmpfs over `target` (writable until `remount`ed read-only)."""
    options = f"mode={mode}" + (f",size={size_mb}m" if size_mb else "")
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)


def mount_proc(options: str | None = None, read_only: bool = False) -> None:
    """A /proc of this process's PID namespace (its own processes only, in a new one), e.g. with
    `hidepid=invisible` (no other uid's processes)."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | (MS_RDONLY if read_only else 0), options)


# -- privileges --------------------------------------------------------------------------------------
def drop_bounding_set() -> bool:
    """Every capability out of the bounding set (none can come back through any execve); False
    where this process may not (no CAP_SETPCAP: a container's root), which `no_new_privs` and
    empty sets make up for."""
    cap = 0
    while True:
        if prctl(PR_CAPBSET_DROP, cap) == -1:
            err = ctypes.get_errno()
            if err == errno.EINVAL:
                return True  # past the last capability this kernel knows
            if err == errno.EPERM:
                return False
            check(-1, f"drop capability {cap}")
        cap += 1


def drop_capabilities() -> None:
    """No capability left in the effective, permitted, inheritable or ambient sets (a uid of a
    user namespace keeps them through setresuid; root's uid keeps them without one)."""
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)  # EINVAL before Linux 4.3: there is none then
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    check(_libc.capset(ctypes.byref(header), data), "capset")


def become(uid: int, gid: int) -> None:
    """This process's uid and gid, real, effective and saved, with no supplementary groups; from
    root every capability goes with the uid."""
    if uid == 0 or gid == 0:
        raise SandboxError("an unprivileged uid and gid are required")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def no_new_privs() -> None:
    """No execve grants a privilege again (setuid bits, file capabilities); kept across fork and execve."""
    check(prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")


def not_dumpable() -> None:
    """No core dump, and no process of the same uid may ptrace this one or read its memory through
    /proc. The kernel resets it at execve: it protects a process that runs on without one."""
    check(prctl(PR_SET_DUMPABLE, 0), "prctl(PR_SET_DUMPABLE)")


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """`sig` when the parent (the thread that forked this process) dies; kept across execve,
    cleared by a change of credentials (set it again after `become`)."""
    check(prctl(PR_SET_PDEATHSIG, int(sig)), "prctl(PR_SET_PDEATHSIG)")


# -- seccomp -----------------------------------------------------------------------------------------
DENIED_SYSCALLS_X86_64 = (
    101, 310, 311, 312, 438, 440,  # ptrace, process_vm_readv/writev, kcmp, pidfd_getfd, process_madvise
    165, 166, 155, 272, 308, 428, 429, 430, 431, 432, 433, 442,  # mounts, unshare, setns, the new mount API
    248, 249, 250, 321, 298, 323, 425, 426, 427,  # keyrings, bpf, perf, userfaultfd, io_uring
    246, 320, 175, 313, 176, 303, 304, 172, 173,  # kexec, modules, file handles, iopl/ioperm
    167, 168, 169, 163, 164, 227, 159, 103,  # swap, reboot, acct, clocks, the kernel's log
    170, 171, 179, 135, 161,  # host names, quota, personality, chroot
)  # fmt: skip
"""What no function and no model needs, and what widens the kernel's attack surface or reaches
another process (the numbers of x86-64's table)."""


def seccomp_filter() -> bytes | None:
    """A classic BPF program answering EPERM to `DENIED_SYSCALLS_X86_64`, refusing new namespaces
    through clone and making clone3 unknown (glibc then falls back to clone, whose flags a filter
    can read). x86-64 only (numbers differ by architecture; None elsewhere): a syscall of another
    ABI (i386 through int 0x80, x32) is refused whole."""
    if os.uname().machine not in ("x86_64", "AMD64"):
        return None
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS  # SECCOMP_RET_ERRNO
    allow, audit_x86_64 = 0x7FFF0000, 0xC000003E
    ld, jeq, jge, jset, ret, ldabs, k = 0x00, 0x15, 0x35, 0x45, 0x06, 0x20, 0x00  # BPF_LD|W|ABS, JMP|JEQ|K, ...
    prog: list[tuple[int, int, int, int]] = [
        (ld | ldabs, 0, 0, 4),  # seccomp_data.arch
        (jeq | k, 1, 0, audit_x86_64),
        (ret, 0, 0, eperm),
        (ld | ldabs, 0, 0, 0),  # seccomp_data.nr
        (jge | k, 0, 1, 0x40000000),  # x32's bit
        (ret, 0, 0, eperm),
    ]
    for nr in DENIED_SYSCALLS_X86_64:
        prog += [(jeq | k, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [
        (jeq | k, 0, 1, 435),  # clone3
        (ret, 0, 0, enosys),
        (jeq | k, 0, 3, 56),  # clone: its flags
        (ld | ldabs, 0, 0, 16),  # seccomp_data.args[0], low half
        (jset | k, 0, 1, NEW_NAMESPACES),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]  # fmt: skip
    return b"".join(struct.pack("<HBBI", *insn) for insn in prog)


def install_seccomp(program: bytes) -> None:
    """Filter this thread, its children and whatever they execve through `program` (for good:
    a filter cannot be removed). Needs `no_new_privs` first, or CAP_SYS_ADMIN."""
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = ctypes.create_string_buffer(struct.pack("<HxxxxxxQ", len(program) // 8, ctypes.addressof(buf)), 16)
    check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp")


# -- the environment ---------------------------------------------------------------------------------
def replace_environment(env: dict[str, str]) -> None:
    """`os.environ` becomes exactly `env`, and the bytes the process's environment started as
    (what /proc/<pid>/environ shows, whatever os.environ holds) are zeroed: a process that runs on
    without an execve (a spawned or forked child) leaves nothing of its parent's environment."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        env_start, env_end = int(fields[47]), int(fields[48])  # fields 50 and 51 of proc_pid_stat(5)
    except (OSError, ValueError, IndexError):
        env_start = env_end = 0
    os.environ.clear()
    os.environ.update(env)
    if 0 < env_start < env_end:
        ctypes.memset(env_start, 0, env_end - env_start)


# -- paths -------------------------------------------------------------------------------------------
def under(path: str, folder: str) -> bool:
    """`path` is `folder` or lies inside it (as strings: both absolute and normalised)."""
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


def depth(path: str) -> int:
    """How many names deep `path` is: / is 0, /a 1 (outer paths are mounted first)."""
    return len([part for part in path.split("/") if part])


def nearest_existing(path: str) -> str:
    """`path`, or the nearest folder above it that exists."""
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path
