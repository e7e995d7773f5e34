"""Where faas-gpu keeps its state: one place for every path under FAAS_GPU_HOME."""

from __future__ import annotations

import fnmatch
import os
import stat
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"  # traces, profiles, prices beside the checkout


STATE_FOLDER_NAME = ".faas-gpu"
"""The state folder's name in the folder `faas-gpu up` runs in."""


def home() -> Path:
    """State folder: $FAAS_GPU_HOME, else ./.faas-gpu (as faasd keeps /var/lib/faasd).

    Where `up` and the daemons keep their state. The other commands find the stack from any
    folder (`faas_gpu.running.locate`), which reads the record `up` leaves in `config_file()`.
    """
    return Path(os.environ.get("FAAS_GPU_HOME") or Path.cwd() / STATE_FOLDER_NAME).resolve()


CONFIG_FILE_NAME = "config.yml"
CONFIG_FOLDER_NAME = "faas-gpu"  # under $XDG_CONFIG_HOME or ~/.config
_folder_noted: set[str] = set()


def config_file() -> Path:
    """The per-user config file: $FAAS_GPU_CONFIG (a file), else
    $XDG_CONFIG_HOME/faas-gpu/config.yml, else ~/.config/faas-gpu/config.yml.

    It holds only what lets a command run in any folder find the stack (`faas_gpu.running`);
    the stack's own state stays in its state folder. Before, $FAAS_GPU_CONFIG named the folder:
    a value that is an existing folder is still read as `<folder>/config.yml`, with a note.
    """
    value = os.environ.get("FAAS_GPU_CONFIG")
    if value:
        path = Path(value).expanduser().resolve()
        try:
            folder = path.is_dir()
        except OSError:  # a folder this user may not look into: not one of its own
            folder = False
        if not folder:
            return path
        if value not in _folder_noted:
            _folder_noted.add(value)
            print(
                f"faas-gpu: note: FAAS_GPU_CONFIG names a file now; {value} is a folder, so "
                f"{path / CONFIG_FILE_NAME} is used (set FAAS_GPU_CONFIG={path / CONFIG_FILE_NAME})",
                file=sys.stderr,
            )
        return path / CONFIG_FILE_NAME
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".config"
    return (base / CONFIG_FOLDER_NAME / CONFIG_FILE_NAME).resolve()


def secrets_dir(state: Path | None = None) -> Path:
    """Basic-auth credentials, as OpenFaaS mounts them (basic-auth-user, basic-auth-password),
    of the state folder `state` (default `home()`)."""
    return (state or home()) / "secrets"


def function_secrets_dir(namespace: str) -> Path:
    """Function secrets, one file per secret, mode 0600."""
    return home() / "function-secrets" / namespace


def images_dir(state: Path | None = None) -> Path:
    """The local image store: one folder per image name built by `faas-gpu build`, of the state
    folder `state` (default `home()`)."""
    return (state or home()) / "images"


def logs_dir() -> Path:
    return home() / "logs"


def run_dir() -> Path:
    """Per-replica scratch folders (TMPDIR with the watchdog's lock file)."""
    return home() / "run"


def state_db(state_home: Path | None = None) -> Path:
    """The embedded datastore's file, in `state_home` (a daemon's --home), else in `home()`.
    Every daemon opens it through here, so they all meet in one file."""
    return (home() if state_home is None else state_home) / "state.db"


STACK_FILE = "stack.json"  # the daemons `faas-gpu up` started (`faas_gpu.supervise`)
DOWN_FILE = "stack.down"  # written by `faas-gpu down` before it stops anything: nobody restarts the stack
LOCK_FILE = "supervisor.lock"  # held by the one supervisor of a state folder
STATE_ENTRIES = (
    "state.db*", "queue.db*", "history.db*", "profiles.db*", "logs", "images", "run", "secrets",
    "function-secrets", "models", "scheduler-models", "mps", "nodes", "containers", "forkserver",
    "*.json", "*.log", "*.pid", ".*.pid.*", DOWN_FILE, LOCK_FILE,
)  # fmt: skip
"""What faas-gpu itself writes in the state folder (the only entries a start tightens)."""
PRIVATE_UMASK = 0o077
"""The state folder holds credentials, function records, logs and request bodies: like the secrets,
only its user reads it (0700 folders, 0600 files)."""


def private_umask() -> None:
    """Make everything this process (and the replicas it starts) creates private to its user."""
    os.umask(PRIVATE_UMASK)


def make_private(path: Path) -> None:
    """chmod one entry: folders 0700, files 0600 (0700 when the owner may execute them). An entry
    given to another group on purpose keeps that group's read (and a folder's traverse), never its
    write: the GPU Manager's model store, which its sandboxed workers' group reads
    (`gpu_manager/isolation.py`); other users still cannot reach it through the 0700 folder."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return
    group = st.st_mode & 0o050 if st.st_gid != os.getegid() else 0
    if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
        os.chmod(path, 0o700 | group)
    else:
        os.chmod(path, 0o600 | (group & 0o040))


def make_tree_private(root: Path) -> None:
    """`make_private` over a whole tree (an image copied in from a build folder keeps its 0644s)."""
    make_private(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            make_private(Path(folder) / name)


def ensure_private_home(path: Path | None = None) -> Path:
    """Create the state folder 0700, and tighten what an older version left readable in it.

    Only the folder and the top-level entries faas-gpu writes (STATE_ENTRIES) are changed, so a
    $FAAS_GPU_HOME shared with other files keeps theirs; what lies deeper is out of reach once the
    folder is 0700, and new files follow the daemons' umask.
    """
    path = Path(path) if path is not None else home()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    make_private(path)
    for entry in path.iterdir():
        if not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in STATE_ENTRIES):
            continue
        try:
            make_private(entry)
        except OSError:  # gone meanwhile, or not ours
            pass
    return path
