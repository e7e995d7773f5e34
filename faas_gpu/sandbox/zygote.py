"""The fork server (a zygote): python3-gpu replicas forked from a process that has already
imported torch and the template's code, so they share its pages instead of importing it each.

Why: a replica that imports torch itself holds ~400 MB of its own and takes 1.5 s and more before
it serves (issue 44). Forked from a process that holds them already, what it imports is shared
copy-on-write: a replica's own memory is what it writes and what its handler loads.

What runs here, and in which process:
- the **server** (`serve`): started by the provider's process runtime, one per node, with a
  clean environment and OMP_NUM_THREADS=1 (OpenMP's pool would be a second thread, and a fork
  of a threaded process keeps one thread of a pool that believes it has two). It imports
  `PRELOAD` and the template's watchdog package, and then no code of anyone's: it never imports
  a handler, an image's file or a function environment's package. It listens on a unix socket in
  a folder only its user may enter, and serves a peer that is its own parent (the provider, by
  SO_PEERCRED's pid and uid) and nobody else. It exits when the provider does (EOF on its stdin).
  It checks it is single-threaded before every fork. It never decodes a request: it receives
  it into one buffer, forks the relay and zeroes the buffer, so that no function's environment or
  paths are left in its memory (freed or not) for a replica forked later to read.
- per request, a **relay** (the server's child, in a session of its own): decodes and checks the
  request (a refusal is its answer; it exits), makes the replica's namespaces
  (`replica.unshare_namespaces`), forks the replica and says its own pid; then it relays the
  provider's signals to the replica, and when the replica exits writes its status on the
  request's connection and exits. When the provider dies (EOF on that connection) it kills the
  replica. It outlives a crash of the server: replicas keep serving while a new one starts.
- the **replica** (PID 1 of its PID namespace): keeps only the descriptors the provider sent for
  it, enters the walls (`replica.enter`: the same sandbox, uid, mounts, seccomp filter, not
  dumpable and clean environment an exec'd replica gets), and only then makes its image its path,
  reseeds what a fork shares (Python's `random`, numpy's), and serves: the watchdog's `serve`,
  which imports index.py and the handler from the image.

What a forked replica shares with its siblings, and an exec'd one does not: the layout of the
template's memory (ASLR is per exec: every replica has the same addresses for what the server
loaded) and Python's hash seed. Neither lets it reach another process (ptrace, process_vm_* and
/proc of other processes stay out of reach), and an exec'd replica is what a function gets where
that matters (FAAS_GPU_FORK_SERVER=off).

Protocol (SOCK_SEQPACKET, one message each way, then the exit): the request is `marshal` of
{"sandbox": `Sandbox.encode()`, "site": [the function environment's site-packages]} with the
descriptors as SCM_RIGHTS: first the replica's stdout and stderr, then `sandbox.files`' in the
order of their numbers. The answer is {"pid": the relay's pid} or {"error": why, "fallback": True
when the provider should exec the replica instead}; then {"exit": exit code} when it ends.
"""

from __future__ import annotations

import array
import gc
import marshal
import os
import select
import signal
import socket
import struct
import sys

from faas_gpu.sandbox import primitives as p
from faas_gpu.sandbox.primitives import SandboxError
from faas_gpu.sandbox.replica import NOT_ISOLATED, Sandbox, enter, unshare_namespaces

ZYGOTE_MODULE = "faas_gpu.sandbox.zygote"
"""How a process is known for the fork server or one of its relays (a forked replica's first
process outside its namespaces) by its command line: `python -m` this module."""
PRELOAD = (
    "torch",
    "flask",
    "werkzeug.datastructures",
    "faas_gpu.client",
    "faas_gpu.tracing",
    "faas_gpu.contract.env",
    "faas_gpu.contract.headers",
    "faas_gpu.contract.slo",
    "http.server",
    "socketserver",
)
"""What python3-gpu's index.py and its watchdog import before any handler code runs."""
WATCHDOG_PACKAGE = "faas_gpu_watchdog"
MAX_REQUEST = 1 << 16
"""A request is a few kilobytes (a sandbox, a few paths); one longer (a function with large
`envVars`) is cut by SOCK_SEQPACKET and refused, and that replica is exec'd."""
MAX_FDS = 8
_UCRED = struct.Struct("3i")


class Refused(Exception):
    """A request not served; `fallback`: the provider may exec the replica instead."""

    def __init__(self, why: str, fallback: bool = False):
        super().__init__(why)
        self.fallback = fallback


# -- the server --------------------------------------------------------------------------------------
def preload(template: str) -> None:
    """Import what every replica of the template imports; the template's folder is on the path only
    for its watchdog package (a replica's path is its image's)."""
    for name in PRELOAD:
        __import__(name)
    sys.path.insert(0, template)
    try:
        for name in ("config", "watchdog", "front", "inproc", "process", "proxy", "logs", "metrics", "deadlines"):
            __import__(f"{WATCHDOG_PACKAGE}.{name}")
    finally:
        sys.path.remove(template)
    if sys.path and sys.path[0] in ("", os.getcwd()):  # `python -m`'s working folder: not a replica's path
        del sys.path[0]
    gc.collect()
    gc.freeze()  # what is loaded now is never scanned again: a collection in a replica copies no page of it


def listen(path: str) -> socket.socket:
    """A SOCK_SEQPACKET socket at `path`, in a folder only this uid may enter."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.stat(folder)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{folder}: must be this user's and private (0700)")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o077)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


def peer(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected (the kernel's word, SO_PEERCRED)."""
    return _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


def serve(path: str, template: str) -> int:
    preload(template)
    provider = os.getppid()
    listener = listen(path)
    os.write(1, b"ready\n")
    while True:
        _reap()
        ready, _, _ = select.select([listener, 0], [], [], 1.0)
        if 0 in ready and not os.read(0, 64):
            return 0  # the provider is gone
        if provider != os.getppid():
            return 0
        if listener in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                _handle(listener, conn, provider)
            finally:
                conn.close()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _answer(conn: socket.socket, message: dict) -> None:
    try:
        conn.send(marshal.dumps(message))
    except OSError:
        pass


def _handle(listener: socket.socket, conn: socket.socket, provider: int) -> None:
    """Take the request, fork its relay, and forget it. The server never decodes a request: a
    function's environment and paths become objects in the relay only, and the bytes received
    here are zeroed once the relay has its copy. A forked replica inherits the server's memory,
    freed blocks included; anything of one tenant's request left there would be readable by every
    replica forked after it (issue 41)."""
    pid, uid, _gid = peer(conn)
    if pid != provider or uid != os.geteuid():
        _answer(conn, {"error": "refused: only the provider that started the fork server may use it"})
        _discard(conn)
        return
    fds: list[int] = []
    try:
        conn.settimeout(10)
        size, fds, flags = _receive(conn)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise Refused(f"request: over {MAX_REQUEST} bytes or {MAX_FDS} descriptors", fallback=True)
        if not p.single_threaded():
            raise Refused("the fork server runs threads: it does not fork", fallback=True)
        child = os.fork()
        if child == 0:
            _relay(listener, conn, bytes(_REQUEST[:size]), fds)  # never returns
    except Refused as exc:
        _answer(conn, {"error": str(exc), "fallback": exc.fallback})
    except (OSError, ValueError) as exc:
        _answer(conn, {"error": f"fork server: {exc}", "fallback": True})
    finally:
        _REQUEST[:] = _ZEROS
        for fd in fds:
            os.close(fd)


_REQUEST = bytearray(MAX_REQUEST)
"""Where every request is received, in place (no bytes object of it is made in the server)."""
_ZEROS = bytes(MAX_REQUEST)


def _receive(conn: socket.socket) -> tuple[int, list[int], int]:
    """One message into `_REQUEST`: (its size, the descriptors that came with it, the flags)."""
    size, ancdata, flags, _addr = conn.recvmsg_into([_REQUEST], socket.CMSG_LEN(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
    return size, fds, flags


def _discard(conn: socket.socket) -> None:
    """Take what a refused peer sent (its descriptors closed unread), so that it reads the refusal
    rather than a reset connection."""
    try:
        conn.settimeout(0.5)
        _size, fds, _flags = _receive(conn)
        for fd in fds:
            os.close(fd)
    except OSError:
        pass
    finally:
        _REQUEST[:] = _ZEROS


def parse(raw: bytes, nfds: int) -> tuple[Sandbox, list[str]]:
    """The request's sandbox and site folders; Refused naming what is wrong with it."""
    try:
        d = marshal.loads(raw)
    except (EOFError, ValueError, TypeError):
        raise Refused("request: not a fork server request") from None
    if not isinstance(d, dict) or not isinstance(d.get("sandbox"), bytes) or not isinstance(d.get("site"), list):
        raise Refused("request: sandbox (bytes) and site (a list) are required")
    try:
        sb = Sandbox.decode(d["sandbox"])
    except (EOFError, ValueError, TypeError, KeyError):
        raise Refused("request: sandbox is not a sandbox") from None
    if sb.mode == NOT_ISOLATED:
        raise Refused("request: the fork server starts isolated replicas only", fallback=True)
    if sb.uid == 0 or sb.gid == 0 or (sb.mode != "userns" and (sb.uid is None or sb.gid is None)):
        raise Refused("request: a replica's uid and gid must be unprivileged")
    if not sb.argv or not all(isinstance(a, str) for a in sb.argv) or not os.path.isabs(sb.cwd):
        raise Refused("request: argv and an absolute cwd are required")
    if nfds != 1 + len(sb.files):
        raise Refused(f"request: {1 + len(sb.files)} descriptors expected (output, then files), got {nfds}")
    site = d["site"]
    if not all(isinstance(s, str) and os.path.isabs(s) for s in site):
        raise Refused("request: site folders must be absolute paths")
    return sb, site


def check_site(site: list[str]) -> None:
    """Refuse (fallback) a function environment with a package of its own that this process has
    loaded already: the replica would run the server's copy, not the one its function installed."""
    loaded = {name.partition(".")[0] for name in sys.modules}
    for folder in site:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for entry in names:
            if entry.endswith((".dist-info", ".egg-info", ".pth")) or entry == "__pycache__":
                continue
            top = entry.partition(".")[0]
            if top in loaded:
                raise Refused(f"the function's environment has its own {top!r}, loaded already here", fallback=True)


# -- the relay ---------------------------------------------------------------------------------------
def _relay(listener: socket.socket, conn: socket.socket, raw: bytes, fds: list[int]) -> None:
    code = 1
    try:
        os.setsid()  # the provider signals the replica's group, as it does a launcher's
        listener.close()
        try:
            sb, site = parse(raw, len(fds))
            check_site(site)
        except Refused as exc:
            _answer(conn, {"error": str(exc), "fallback": exc.fallback})
            os._exit(1)
        try:
            unshare_namespaces(sb)
        except (SandboxError, OSError) as exc:
            _answer(conn, {"error": f"namespaces: {exc}", "fallback": True})
            os._exit(1)
        alive, keep = os.pipe()
        replica = os.fork()
        if replica == 0:
            os.close(keep)
            _replica(conn, sb, site, fds, alive)  # never returns
        os.close(alive)
        for fd in fds:
            os.close(fd)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, lambda signum, _frame: _kill(replica, signum))
        _answer(conn, {"pid": os.getpid()})
        code = _watch(conn, replica, wake_r)
    except BaseException as exc:  # noqa: BLE001 — the relay says why on the server's log, exits
        os.write(2, f"faas-gpu fork server: relay: {exc}\n".encode(errors="replace"))
    os._exit(code)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _watch(conn: socket.socket, replica: int, wake: int) -> int:
    """Until the replica exits (its status to the provider) or the provider goes (the replica killed)."""
    while True:
        pid, status = os.waitpid(replica, os.WNOHANG)
        if pid == replica:
            code = os.waitstatus_to_exitcode(status)
            _answer(conn, {"exit": code})
            # alive until the provider lets go of the replica: its pid (the group the provider
            # signals last) is not free for another process before then
            select.select([conn], [], [])
            return 0 if code == 0 else 1
        ready, _, _ = select.select([conn, wake], [], [])
        if wake in ready:
            try:
                os.read(wake, 64)
            except BlockingIOError:
                pass
        if conn in ready:
            try:
                gone = not conn.recv(64)
            except OSError:
                gone = True
            if gone:
                _kill(replica, signal.SIGKILL)
                os.waitpid(replica, 0)
                return 1


# -- the replica -------------------------------------------------------------------------------------
def _replica(conn: socket.socket, sb: Sandbox, site: list[str], fds: list[int], alive: int) -> None:
    try:
        conn.detach()  # its number is closed below with every other one not the replica's
        alive = _descriptors(sb, fds, alive)
        enter(sb)
        if select.select([alive], [], [], 0)[0]:  # EOF: the relay is gone
            os._exit(1)
        os.close(alive)
        _become(sb, site)
    except BaseException as exc:  # noqa: BLE001 — anything: say it on the function's log, exit
        os.write(2, f"faas-gpu sandbox: {exc}\n".encode(errors="replace"))
        os._exit(126)
    _run_watchdog()


def _descriptors(sb: Sandbox, fds: list[int], alive: int) -> int:
    """Only the replica's descriptors left: /dev/null on 0, its output on 1 and 2, its files at
    their numbers, and `alive` (returned at its new number); every other one the server or the
    relay held is closed."""
    high = [_fcntl_dup(fd) for fd in fds]
    alive = _fcntl_dup(alive)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(high[0], 1)
    os.dup2(high[0], 2)
    targets = {0, 1, 2}
    for number, fd in zip(sorted(sb.files), high[1:], strict=True):
        os.dup2(fd, number)
        targets.add(number)
    targets.add(alive)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in targets:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in targets - {alive}:
        os.set_inheritable(fd, True)
    return alive


def _fcntl_dup(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)


def _become(sb: Sandbox, site: list[str]) -> None:
    """The process as `python fwatchdog.py` in the image would be: the image first on the path,
    then the function environment's packages; what a fork shares and must not, made its own."""
    import random
    import site as site_module
    import tempfile

    context = sb.cwd
    sys.argv = [os.path.join(context, "fwatchdog.py")]
    before = list(sys.path)
    for folder in site:
        site_module.addsitedir(folder)
    added = [entry for entry in sys.path if entry not in before]
    sys.path[:] = [context, *added, *before]
    if not _same_watchdog(context):
        for name in [m for m in sys.modules if m == WATCHDOG_PACKAGE or m.startswith(WATCHDOG_PACKAGE + ".")]:
            del sys.modules[name]
    tempfile.tempdir = None  # the server's was computed in its own /tmp
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP read the server's OMP_NUM_THREADS=1 when torch loaded
        try:
            threads = int(os.environ.get("OMP_NUM_THREADS") or 0)
        except ValueError:
            threads = 0
        torch.set_num_threads(threads if threads > 0 else len(os.sched_getaffinity(0)))
    for stream in (sys.stdout, sys.stderr):  # made for the server's pipe: the function's log gets each line now
        stream.reconfigure(line_buffering=True, write_through=True)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


def _same_watchdog(context: str) -> bool:
    """Whether the image's watchdog package is, byte for byte, the one this process loaded."""
    loaded = sys.modules.get(WATCHDOG_PACKAGE)
    if loaded is None or not getattr(loaded, "__file__", None):
        return False
    ours, theirs = os.path.dirname(loaded.__file__), os.path.join(context, WATCHDOG_PACKAGE)
    try:
        names = sorted(n for n in os.listdir(theirs) if n.endswith(".py"))
        if names != sorted(n for n in os.listdir(ours) if n.endswith(".py")):
            return False
        for name in names:
            with open(os.path.join(ours, name), "rb") as a, open(os.path.join(theirs, name), "rb") as b:
                if a.read() != b.read():
                    return False
    except OSError:
        return False
    return True


def _run_watchdog() -> None:
    code = 0
    try:
        from faas_gpu_watchdog.config import Config
        from faas_gpu_watchdog.watchdog import serve as serve_watchdog

        serve_watchdog(Config(dict(os.environ)))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            code = 1
        else:
            code = exc.code or 0
    except BaseException:  # noqa: BLE001 — what `python fwatchdog.py` would print
        import traceback

        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m faas_gpu.sandbox.zygote SOCKET TEMPLATE_DIR", file=sys.stderr)
        return 2
    try:
        return serve(argv[1], argv[2])
    except (SandboxError, OSError, ImportError) as exc:
        print(f"faas-gpu fork server: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
