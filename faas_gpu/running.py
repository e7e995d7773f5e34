"""The running stack: the per-user record `faas-gpu up` writes, and how a command run in any
folder finds its stack (state folder, gateway URL, credentials, image store) through it.

faas-cli finds its gateway from any folder because `faas-cli login` saved the URL and the token
in ~/.openfaas/config.yml. A faas-gpu stack has more than a URL: its credentials and its local
image store live in its state folder, which `up` makes in the folder it runs in. So `up` records
the stack in the per-user config (`paths.config_file()`, ~/.config/faas-gpu/config.yml, 0600):

    stacks:                            # newest first; `faas-gpu down` removes its entry
    - home: ~/faas-gpu/.faas-gpu
      gateway: http://127.0.0.1:8080
      provider: http://127.0.0.1:8081
      started: 2025-01-01T12:00:00Z

and `locate` resolves a command's state folder in this order, the first that holds a stack wins:

1. $FAAS_GPU_HOME (explicit);
2. `.faas-gpu` beside the stack file (`-f path/stack.yml`), then `./.faas-gpu` of the current
   folder, each only when it is a stack's state folder (credentials, stack.json or state.db: a
   `.faas-gpu` holding only the images an older `faas-gpu build` left there does not count);
3. the newest recorded stack that is running (its supervisor or gateway process is alive).

Every place looked at is kept with why it did not count, so a command that finds nothing, or
fails against what it found, names them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from faas_gpu import paths
from faas_gpu.supervise import STACK_FILE, stack_pids, supervisor_pid

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0")


def record_file() -> Path:
    return paths.config_file()


@dataclass(frozen=True)
class StackRecord:
    """One stack `faas-gpu up` started: its state folder and where it serves."""

    home: Path
    gateway: str
    provider: str = ""
    started: str = ""

    def to_yaml(self) -> dict:
        return {"home": str(self.home), "gateway": self.gateway, "provider": self.provider, "started": self.started}


def read_records(path: Path | None = None) -> list[StackRecord]:
    """The recorded stacks, newest first; an unreadable or foreign file reads as none."""
    path = path or record_file()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    out = []
    for entry in (data.get("stacks") if isinstance(data, dict) else None) or []:
        if isinstance(entry, dict) and entry.get("home") and entry.get("gateway"):
            out.append(
                StackRecord(
                    home=Path(str(entry["home"])),
                    gateway=str(entry["gateway"]).rstrip("/"),
                    provider=str(entry.get("provider") or ""),
                    started=str(entry.get("started") or ""),
                )
            )
    return out


def _write_records(records: list[StackRecord]) -> Path:
    """Replace the record file atomically, private to its user (it names the credentials' folder)."""
    path = record_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = "# written by `faas-gpu up`, cleared by `faas-gpu down`: how the CLI finds the stack from any folder\n"
    text += yaml.safe_dump({"stacks": [r.to_yaml() for r in records]}, sort_keys=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yml")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def runs(home: Path) -> bool:
    """A stack runs for this state folder: its supervisor, or one of its daemons, is alive."""
    return supervisor_pid(home) is not None or bool(stack_pids(home))


def record_stack(home: Path, gateway: str, provider: str = "") -> Path:
    """`up`: this stack is the newest; entries of stopped stacks go (a reboot leaves no `down`)."""
    home = Path(home).resolve()
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kept = [r for r in read_records() if r.home != home and runs(r.home)]
    return _write_records([StackRecord(home, gateway.rstrip("/"), provider, started), *kept])


def forget_stack(home: Path) -> bool:
    """`down`: remove this state folder's entry; True when there was one."""
    home = Path(home).resolve()
    records = read_records()
    kept = [r for r in records if r.home != home]
    if len(kept) == len(records):
        return False
    _write_records(kept)
    return True


def is_state_folder(folder: Path) -> bool:
    """A stack has run here: its credentials, its daemons' list or its datastore are present."""
    return (
        (folder / "secrets" / "basic-auth-password").is_file()
        or (folder / STACK_FILE).is_file()
        or paths.state_db(folder).exists()
    )


def same_gateway(a: str | None, b: str | None) -> bool:
    """Two gateway URLs name the same server (loopback names count as one host)."""
    if not a or not b:
        return False
    ua, ub = urlsplit(a.strip().lower()), urlsplit(b.strip().lower())
    host_a, host_b = ua.hostname or "", ub.hostname or ""
    same_host = host_a == host_b or (host_a in LOOPBACK and host_b in LOOPBACK)
    default = {"http": 80, "https": 443}
    port_a, port_b = ua.port or default.get(ua.scheme), ub.port or default.get(ub.scheme)
    return ua.scheme == ub.scheme and same_host and port_a == port_b


@dataclass(frozen=True)
class Located:
    """Where a command's stack is, how it was found, and every place looked at before it."""

    home: Path | None
    how: str = ""  # "$FAAS_GPU_HOME", "beside the stack file", "in the current folder", "recorded by `faas-gpu up`"
    record: StackRecord | None = None  # the record of this state folder, when `up` left one
    searched: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gateway(self) -> str | None:
        """The gateway `up` started for this state folder (None: not recorded)."""
        return self.record.gateway if self.record else None

    @property
    def images(self) -> Path | None:
        return paths.images_dir(self.home) if self.home else None

    def credentials_home(self, gateway: str) -> Path | None:
        """The state folder whose credentials go to `gateway`. A folder named explicitly or found
        here is the user's choice, as ./.faas-gpu always was; a recorded stack's credentials go
        only to the gateway it recorded, never to another one ($OPENFAAS_URL, the stack file)."""
        if self.home is None:
            return None
        if self.how != RECORDED:
            return self.home
        return self.home if same_gateway(gateway, self.gateway) else None

    def describe(self) -> str:
        """One phrase for messages: which state folder, and how it was found (or what was searched)."""
        if self.home is None:
            return f"no faas-gpu stack found (searched: {'; '.join(self.searched)})"
        return f"the stack of {self.home} ({self.how})"

    def not_found(self, command: str) -> str:
        return f"{command}: {self.describe()}; start one with `faas-gpu up`, or set FAAS_GPU_HOME to its state folder"


EXPLICIT = "$FAAS_GPU_HOME"
BESIDE_STACK = "beside the stack file"
IN_CWD = "in the current folder"
RECORDED = "recorded by `faas-gpu up`"


def locate(stack_dir: Path | None = None, cwd: Path | None = None) -> Located:
    """The state folder of the stack a command talks to (see the module's docstring for the order)."""
    records = read_records()

    def found(home: Path, how: str, searched: list[str]) -> Located:
        home = home.resolve()
        record = next((r for r in records if r.home == home), None)
        return Located(home, how, record, tuple(searched))

    searched: list[str] = []
    explicit = os.environ.get("FAAS_GPU_HOME")
    if explicit:
        return found(Path(explicit).expanduser(), EXPLICIT, searched)
    searched.append("$FAAS_GPU_HOME (unset)")
    folders = []
    for folder, how in ((stack_dir, BESIDE_STACK), (cwd or Path.cwd(), IN_CWD)):
        if folder is not None and Path(folder).resolve() not in [f for f, _ in folders]:
            folders.append((Path(folder).resolve(), how))
    for folder, how in folders:
        candidate = folder / paths.STATE_FOLDER_NAME
        if is_state_folder(candidate):
            return found(candidate, how, searched)
        why = "no stack's credentials in it" if candidate.is_dir() else "absent"
        searched.append(f"{candidate} ({why})")
    where = record_file()
    if not records:
        searched.append(f"{where} (no stack recorded)")
    for record in records:
        if runs(record.home):
            return found(record.home, RECORDED, searched)
        searched.append(f"{record.home} (recorded in {where}, not running)")
    return Located(None, searched=tuple(searched))
