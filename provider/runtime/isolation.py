"""How the local runtime walls a replica off from the stack and from other functions.

The walls themselves are `faas_gpu.sandbox`'s (namespaces, a uid of the function's own, no
capabilities, a clean environment); this module says what a replica sees through them:

- nothing of the state folder (the admin password, the cluster token, every function's token, the
  datastore, the logs, other images), of the stack user's home or of its config folder; only its
  own built image comes back, read-only, at its own path (its environment's scripts name it);
- what the stack's interpreter and code need, read-only (and back in where it lay in a hidden
  folder: a virtual environment under /root);
- its own secrets, read-only at OpenFaaS's /var/openfaas/secrets/<name>, and its function's token
  at /var/openfaas/faas-gpu/token (`faas_gpu.contract.replica`), never in its environment;
- a private /tmp and /var/tmp (folders of its replica under the state folder's run/, on disk, gone
  with it), a private HOME (/home/app) and /dev/shm, its own /proc.

`choose` runs one sandboxed `python -c "import faas_gpu"` when the runtime starts, with the walls
a replica gets: where the kernel or the host refuses them, replicas run unisolated and the stack
says so plainly (the log, /system/info, `faas-gpu up`), unless FAAS_GPU_ISOLATION=on.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from faas_gpu import paths, sandbox
from faas_gpu.contract import env as contract_env
from faas_gpu.contract import replica as where
from faas_gpu.imagestore import stack_site_packages

log = logging.getLogger(__name__)

TRACES_FD = 3
"""The descriptor a sandboxed replica appends its spans to (the stack's FAAS_GPU_TRACES_FILE,
opened by its launcher: the replica's uid may not open it)."""
PROBE_UID = sandbox.FIRST_UID + sandbox.UID_COUNT
"""The uid the start-up check runs as: one past the functions' range, never a function's."""
UIDS_FILE = "replica-uids.json"
"""The state folder's table of each function's uid (`sandbox.UidTable`)."""


@dataclass(frozen=True)
class Isolation:
    """How this runtime's replicas run: `mode` is one of `sandbox`'s; `reason`, why not isolated."""

    mode: str
    reason: str = ""

    @property
    def isolated(self) -> bool:
        return self.mode != sandbox.NOT_ISOLATED

    def describe(self) -> dict[str, object]:
        """For /system/info and `faas-gpu up`."""
        if self.mode == sandbox.ISOLATED_BY_UID:
            how = (
                "each function's replicas run as a uid of its own, in mount, PID and IPC namespaces of their "
                "own, without the state folder, its secrets at /var/openfaas/secrets"
            )
        elif self.mode == sandbox.ISOLATED_BY_USERNS:
            how = (
                "each replica runs in user, mount, PID and IPC namespaces of its own, without the state folder, "
                "its secrets at /var/openfaas/secrets (as the stack's user: run the stack as root for a uid per "
                "function)"
            )
        else:
            how = f"functions are NOT isolated: they run as the stack's user and see what it sees ({self.reason})"
        return {"isolated": self.isolated, "mode": self.mode, "message": how}


@dataclass(frozen=True)
class ReplicaFolders:
    """A replica's own folders on the host (under its run folder): what its sandbox binds in."""

    tmp: Path
    var_tmp: Path
    home: Path
    secrets: Path
    faas_gpu: Path

    @classmethod
    def make(cls, run_dir: Path, uid: int | None) -> ReplicaFolders:
        """Made empty, owned by the replica's uid (when it has one of its own) and private to it."""
        folders = cls(run_dir / "tmp", run_dir / "var-tmp", run_dir / "home", run_dir / "secrets", run_dir / "faas-gpu")
        for folder in (folders.tmp, folders.var_tmp, folders.home, folders.secrets, folders.faas_gpu):
            folder.mkdir(mode=0o700, parents=True)
            if uid is not None:
                os.chown(folder, uid, uid)
        return folders

    def put(self, folder: Path, name: str, data: bytes, uid: int | None) -> None:
        """A read-only file of the replica's (a secret, its token)."""
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if uid is not None:
            os.chown(path, uid, uid)


def hidden_paths(home: Path) -> list[str]:
    """What no replica sees: the state folder, the stack's config folder, its user's home, and,
    for a stack run as a user (whose replicas keep that user's uid and groups), that user's
    runtime folder and the Docker socket."""
    out = [home, paths.config_file().parent]
    user_home = _user_home()
    if user_home:
        out.append(Path(user_home))
    if os.geteuid() != 0:
        out.append(Path(os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"))
        out += [Path("/run/docker.sock"), Path("/var/run/docker.sock")]
    found = []
    for p in out:
        real = os.path.realpath(p)
        if real != "/" and os.path.lexists(real) and real not in found:
            found.append(real)
    return found


def _user_home() -> str | None:
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return None


def stack_paths() -> list[str]:
    """What a replica needs of the host to run the stack's interpreter and code: its prefixes,
    its import path (PYTHONPATH, a checkout's code, the site-packages function environments reuse)."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)]
    found += [str(paths.REPO_ROOT), *stack_site_packages()]
    found += [p for p in sys.path if p and os.path.isabs(p)]
    found += [p for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p and os.path.isabs(p)]
    return [os.path.realpath(p) for p in found if os.path.isdir(p)]


def outermost(needed: list[str], hidden: list[str]) -> list[str]:
    """`needed` without the paths another of them brings in already, each then bound in once,
    read-only: where it lies in a hidden folder it comes back, elsewhere it becomes read-only (no
    replica changes the stack's code, even where the stack's user owns it). A path stays when a
    hidden folder lies between it and the one around it (an image in a state folder in a checkout)."""
    found = sorted(set(needed))

    def brought_in(p: str) -> bool:
        return any(
            q != p and _under(p, q) and not any(h != q and _under(p, h) and _under(h, q) for h in hidden) for q in found
        )

    return [p for p in found if not brought_in(p)]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def share_image(folder: Path) -> None:
    """Let other uids read an image (folders 0755, files 0644, executables 0755): a replica with a
    uid of its own reads its image through its sandbox. Nobody else reaches it: the state folder
    above stays 0700, and a sandbox binds in its own image only."""
    for root, _dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, 0o755 if mode & 0o100 else 0o644)


class Walls:
    """The sandbox each replica of one runtime gets: `isolation` says which; `sandbox_of` builds
    one replica's."""

    def __init__(self, home: Path, isolation: Isolation, uids: sandbox.UidTable | None):
        self.home, self.isolation, self.uids = home, isolation, uids
        self.hidden = hidden_paths(home) if isolation.isolated else []
        self.stack = stack_paths()
        self._shared: set[Path] = set()

    @classmethod
    def choose(cls, home: Path, setting: str) -> Walls:
        """Probe the walls (unless `setting` is off): a uid per function where the stack is root,
        a user namespace where it is a user; where they do not hold, unisolated, saying why (`on`:
        refuse to start instead). A root that cannot switch uids (a container's root, mapped to one
        uid) gets no user-namespace walls instead: its replicas would be that root, owner of the
        stack's files."""
        home = Path(os.path.realpath(home))
        if setting == "off":
            return cls(home, Isolation(sandbox.NOT_ISOLATED, f"{contract_env.ISOLATION.name}=off"), None)
        mode = sandbox.ISOLATED_BY_UID if os.geteuid() == 0 else sandbox.ISOLATED_BY_USERNS
        uids = sandbox.UidTable(home / UIDS_FILE) if mode == sandbox.ISOLATED_BY_UID else None
        walls = cls(home, Isolation(mode), uids)
        reason = walls.probe()
        if reason is None:
            return walls
        if setting == "on":
            raise RuntimeError(f"{contract_env.ISOLATION.name}=on, but replicas cannot be isolated here: {reason}")
        log.warning("functions are NOT isolated (replicas run as the stack's user): %s", reason)
        return cls(home, Isolation(sandbox.NOT_ISOLATED, reason), None)

    def probe(self) -> str | None:
        """Run `python -c "import faas_gpu"` as a replica would run: None when it ran, else why not."""
        scratch = Path(tempfile.mkdtemp(prefix=".probe-", dir=self.home))
        try:
            uid = PROBE_UID if self.isolation.mode == sandbox.ISOLATED_BY_UID else None
            folders = ReplicaFolders.make(scratch, uid)
            argv = [sys.executable, "-c", "import faas_gpu"]
            env = {"PATH": where.STANDARD_PATH}
            if os.environ.get("PYTHONPATH"):
                env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            return sandbox.probe(self._sandbox(argv, env, where.HOME, folders, uid, image=None))
        except OSError as exc:
            return str(exc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def uid_of(self, namespace: str, name: str) -> int | None:
        """The function's own uid (None: replicas keep the stack's)."""
        return self.uids.uid(f"{namespace}/{name}") if self.uids is not None else None

    def replica_env(self, folders: ReplicaFolders, token: bool) -> dict[str, str]:
        """Where a replica finds its HOME, secrets and token, inside its sandbox or (unisolated) on the host."""
        if self.isolation.isolated:
            env = {"HOME": where.HOME}
            if token:
                env[contract_env.TOKEN_FILE.name] = where.TOKEN_PATH
        else:  # no mount namespace: the replica's own folders where they are
            env = {"HOME": str(folders.home), "TMPDIR": str(folders.tmp), "secret_mount_path": f"{folders.secrets}/"}
            if token:
                env[contract_env.TOKEN_FILE.name] = str(folders.faas_gpu / "token")
        if contract_env.TRACES_FILE.is_set(os.environ):
            env[contract_env.TRACES_FILE.name] = f"/dev/fd/{TRACES_FD}"
        return env

    def sandbox_of(
        self, argv: list[str], env: dict[str, str], cwd: Path | None, folders: ReplicaFolders, uid: int | None,
        image: Path | None,
    ) -> sandbox.Sandbox:  # fmt: skip
        """One replica's sandbox; `cwd` None: its HOME. `image`: its image's folder, read-only inside."""
        if image is not None and uid is not None and image not in self._shared:
            share_image(image)
            self._shared.add(image)
        if cwd is None:
            cwd = Path(where.HOME) if self.isolation.isolated else folders.home
        return self._sandbox(argv, env, str(cwd), folders, uid, image)

    def _sandbox(
        self, argv: list[str], env: dict[str, str], cwd: str, folders: ReplicaFolders, uid: int | None,
        image: Path | None,
    ) -> sandbox.Sandbox:  # fmt: skip
        files = {}
        if contract_env.TRACES_FILE.is_set(os.environ):
            files[TRACES_FD] = str(contract_env.TRACES_FILE.read(os.environ))
        if not self.isolation.isolated:
            return sandbox.Sandbox(argv, env, cwd, files=files, parent=os.getpid())
        needed = [*self.stack, *([str(image)] if image is not None else [])]
        mounts = [
            sandbox.Mount(folders.tmp, "/tmp", writable=True),
            sandbox.Mount(folders.var_tmp, "/var/tmp", writable=True),
            sandbox.Mount(folders.home, where.HOME, writable=True),
            *(sandbox.Mount(p, p) for p in outermost(needed, self.hidden)),
            sandbox.Mount(folders.secrets, where.SECRETS_PATH),
            sandbox.Mount(folders.faas_gpu, where.FAAS_GPU_DIR),
        ]
        return sandbox.Sandbox(
            argv,
            env,
            cwd,
            mode=self.isolation.mode,
            uid=uid,
            gid=uid,
            hide=self.hidden,
            mounts=mounts,
            tmpfs=["/dev/shm"],
            files=files,
            parent=os.getpid(),
        )
