"""Walls around a child process that runs what nobody vouched for, entered by the child itself:
a GPU Manager's model worker (the policy, what a worker sees, is `gpu_manager/isolation.py`).

A model worker parses and runs uploaded artifacts; the checks of `faas_gpu.models` say what may
be loaded, and these walls say what a loader bug would gain: the child gets an unprivileged
identity, a network of its own with nothing in it, a read-only view of the filesystem in which
the folders it must not see (the state folder: secrets, datastore, logs) are empty, a private
scratch as the only place it writes, `no_new_privs`, no capabilities, the seccomp filter, a clean
environment, and it is not dumpable (other processes of its uid cannot read its memory). As
bubblewrap builds them for a plain process, but with no extra exec: the child calls
`enter(walls)` first thing, while it is still single-threaded (a namespace joined by one thread
of many is that thread's alone). A `multiprocessing` spawn child is single-threaded until it
imports torch, and its pipe to the parent, the descriptors passed over it (a memory file) and its
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
usable, so /dev/nvidia* work), each `hide` folder covered by an empty read-only tmpfs, each
`scratch` folder a private tmpfs (the only writable places, with `writable` paths), and the
`read_only` and `writable` paths that a cover hid bound back at their own paths. A folder on the
way to one of those that the child's uid could not traverse (pytest's 0700 tmp folder, /root) is
covered too and the path rebuilt inside, so nothing but that path shows. /proc is mounted again
with `hidepid=invisible`: the child sees no other uid's processes (not their command lines either).

Unlike a replica (`replica`), a worker gets no PID namespace (its manager must see and signal
it, and it forks nothing) and no host network.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from faas_gpu.sandbox import primitives as p
from faas_gpu.sandbox.primitives import SandboxError


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


# -- the view of the filesystem ----------------------------------------------------------------------
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
    covers = [os.path.realpath(c) for c in (*walls.hide, *walls.scratch) if os.path.isdir(c)]
    kept = [(os.path.realpath(k), False) for k in walls.read_only]
    kept += [(os.path.realpath(k), True) for k in walls.writable]
    kept = [(k, w) for k, w in kept if os.path.exists(k)]
    for path, _ in kept:
        parts = path.split("/")  # "", "a", "b", ...: string work (pathlib's first use costs ms here)
        for n in range(2, len(parts)):
            folder = "/".join(parts[:n])
            if any(p.under(folder, c) for c in covers):
                break  # rebuilt inside a cover: traversable
            if not _traversable(folder, uid, gid):
                covers.append(folder)
                break
    # hidden by a cover: shown again; writable: bound onto itself, to be writable in a read-only tree
    binds = [(k, w) for k, w in kept if w or any(p.under(k, c) and k != c for c in covers)]
    return covers, binds


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


def _build_view(walls: Walls, covers: list[str], binds: list[tuple[str, bool]]) -> None:
    """In a new mount namespace: private, read-only, then the covers and binds of `plan`, the
    shallowest first (a cover beneath a bound path hides again what the bind showed)."""
    p.private_root()
    # the kept paths, held before anything covers them (a bind's source must be in this namespace)
    fds = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path, _ in binds}
    try:
        p.read_only_tree()
        scratch = {os.path.realpath(s) for s in walls.scratch}
        writable = dict(binds)
        ops = sorted([(c, "cover") for c in covers] + [(b, "bind") for b, _ in binds], key=lambda op: p.depth(op[0]))
        done: list[tuple[str, str]] = []
        for path, kind in ops:
            above = [op for op in done if p.under(path, op[0]) and path != op[0]]
            under = max(above, key=lambda op: p.depth(op[0]))[1] if above else None  # the nearest: cover or bind
            if kind == "cover":
                if under == "cover":
                    continue  # hidden already
                mode, size = ("1777", walls.scratch_mb) if path in scratch else ("0755", 1)
                p.tmpfs(path, mode, size)
            else:
                if under == "cover":  # rebuilt inside our tmpfs (never on the host's files)
                    _make_mountpoint(path, os.path.isdir(f"/proc/self/fd/{fds[path]}"))
                p.mount(f"/proc/self/fd/{fds[path]}", path, None, p.MS_BIND | p.MS_REC)
            done.append((path, kind))
        for path, kind in done:  # built: hidden folders read-only, kept paths as asked, scratch writable
            if kind == "cover" and path not in scratch:
                p.remount(path)
            elif kind == "bind":
                p.remount(path, read_only=not writable[path])
    finally:
        for fd in fds.values():
            os.close(fd)
    try:  # other uids' processes out of sight (not possible in a user namespace: /proc stays as it is)
        p.mount_proc("hidepid=invisible", read_only=True)
    except OSError:
        pass


def _environment(walls: Walls, home: str) -> dict[str, str]:
    """Only the names `keep_env` allows, HOME and TMPDIR in the scratch, and `set_env`."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if any(k == n or (n.endswith("_") and k.startswith(n)) for n in walls.keep_env)
    }
    return {**keep, "HOME": home, "TMPDIR": home, "USER": "sandbox", "LOGNAME": "sandbox", **dict(walls.set_env)}


# -- entering ----------------------------------------------------------------------------------------
def enter(walls: Walls) -> Isolation:
    """Build the walls around this process (see the module's docstring); call it before anything
    untrusted is read, while the process is single-threaded. Returns what was built."""
    if not p.single_threaded():
        raise SandboxError("sandbox: entered by a process that already runs threads")
    uid, gid = os.getuid(), os.getgid()
    root = os.geteuid() == 0
    target_uid = walls.uid if root and walls.uid is not None else uid
    target_gid = walls.gid if root and walls.gid is not None else gid
    missing: list[str] = []
    flags = p.CLONE_NEWNS | (0 if walls.network else p.CLONE_NEWNET) | (0 if walls.ipc else p.CLONE_NEWIPC)
    names = ["mnt"] + ([] if walls.network else ["net"]) + ([] if walls.ipc else ["ipc"])
    covers, binds = plan(walls, target_uid, target_gid)
    try:
        p.unshare(flags if root else flags | p.CLONE_NEWUSER)
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
            p.map_user_namespace(uid, gid)
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
    if (root or names) and not p.drop_bounding_set():
        missing.append("the capability bounding set stays (no CAP_SETPCAP)")
    try:
        if change_uid:
            p.become(target_uid, target_gid)  # from root: every capability goes
    except OSError as exc:
        raise SandboxError(f"sandbox: could not become uid {target_uid} ({exc})") from exc
    if (names and not root) or (root and not change_uid):
        p.drop_capabilities()
    p.no_new_privs()
    p.not_dumpable()
    seccomp = False
    program = p.seccomp_filter() if walls.seccomp else None
    if program is not None:
        p.install_seccomp(program)
        seccomp = True
    elif walls.seccomp:
        missing.append(f"no seccomp filter for {os.uname().machine}")
    scratch = os.path.realpath(walls.scratch[0]) if walls.scratch and names else "/"
    os.chdir(scratch)
    p.replace_environment(_environment(walls, scratch))
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
