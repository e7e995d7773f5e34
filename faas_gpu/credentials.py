"""The daemons' own secrets: the cluster token they share, and their logins to etcd and Redis.

The cluster token is the one secret the daemons share (scheduler, GPU Managers, procurer, the
gateway); it also keys the MAC on every datastore record (`faas_gpu.contract.records`).

Why core and not a daemon's: whichever daemon starts first on a node creates the token file, the
others read it; when it lived in the GPU Manager's daemon module the scheduler had to import the GPU
Manager's daemon to find it. Functions' replicas never hold it: they get their own tokens
(`faas_gpu.fn_credentials`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

TOKEN_FILE = "gpu-manager-token"
"""Its file under the state folder's `secrets/` (named when only GPU Managers had it; kept so
existing state folders keep their token)."""


def ensure_token(secrets_dir: Path) -> str:
    """The cluster token from `secrets_dir`, created (0600, never over an existing file) when
    there is none yet."""
    path = secrets_dir / TOKEN_FILE
    if not path.exists():
        secrets_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


ETCD_CREDENTIALS_FILE = "etcd-credentials"
"""The daemons' etcd login under the state folder's `secrets/` (`user:password`, 0600)."""
REDIS_CREDENTIALS_FILE = "redis-credentials"
"""The daemons' Redis login under the state folder's `secrets/` (`user:password`, or a password
alone for Redis's default user with `requirepass`), 0600."""


@dataclass(frozen=True)
class Login:
    """A user and password for etcd or Redis. Never printed: `repr` hides the password, and the
    daemons log only `where` (the file it came from, or "the URL")."""

    user: str | None
    password: str
    where: str = "the URL"

    def __repr__(self) -> str:
        return f"Login(user={self.user!r}, password=<hidden>, from {self.where})"

    __str__ = __repr__


def read_login(path: Path) -> Login:
    """`user:password` from a file's first line (the first colon splits, as in HTTP basic auth and
    etcdctl's --user); a line without a colon is a password alone (Redis's default user)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"credentials file {path}: {exc.strerror or exc}") from None
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not line:
        raise ValueError(f"credentials file {path}: is empty (want user:password)")
    user, colon, password = line.partition(":")
    if not colon:
        return Login(None, line, str(path))
    if not password:
        raise ValueError(f"credentials file {path}: the password after {user!r}: is empty")
    return Login(user or None, password, str(path))


def split_login(url: str) -> tuple[str, Login | None]:
    """A URL (or comma-separated URLs) without its userinfo, and the login it carried. Userinfo
    works (http://user:pass@host:2379, redis://user:pass@host:6379/0) but shows in `ps`: a file
    (`--etcd-credentials`, `--redis-credentials`, or the state folder's `secrets/`) does not."""
    login: Login | None = None
    parts = []
    for part in url.split(","):
        raw = part.strip()
        if "://" not in raw or "@" not in raw.split("://", 1)[1].split("/", 1)[0]:
            parts.append(raw)
            continue
        u = urlsplit(raw)
        host = u.netloc.rsplit("@", 1)[1]
        if u.password is not None:
            login = Login(unquote(u.username or "") or None, unquote(u.password))
        elif u.username:
            login = Login(None, unquote(u.username))  # redis://:pass@ or redis://pass@: a password alone
        parts.append(urlunsplit((u.scheme, host, u.path, u.query, u.fragment)))
    return ",".join(parts), login


def resolve_login(
    url: str, credentials_file: Path | None, secrets_dir: Path | None, default_name: str
) -> tuple[str, Login | None]:
    """The URL to dial (no userinfo) and the login to use: `credentials_file` when given, else the
    URL's userinfo, else `secrets_dir/default_name` when that file exists, else none."""
    plain, from_url = split_login(url)
    if credentials_file is not None:
        return plain, read_login(credentials_file)
    if from_url is not None:
        return plain, from_url
    default = secrets_dir / default_name if secrets_dir is not None else None
    if default is not None and default.is_file():
        return plain, read_login(default)
    return plain, None


def write_login(path: Path, login: Login) -> None:
    """`user:password` into `path` (0600, replaced atomically): where `faas-gpu up` keeps a login
    it was given in a URL, so that no daemon's command line shows it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{login.user or ''}:{login.password}\n")
    tmp.replace(path)


def redis_login(url: str, login: Login | None) -> dict[str, str]:
    """redis-py's keyword arguments for `login` (empty: the URL's own userinfo, if any, stands)."""
    if login is None:
        return {}
    return {"password": login.password, **({"username": login.user} if login.user else {})}


REDIS_KEYS = "~faas-gpu:*"
"""The keys the daemons use in Redis (the async queue's stream, the invocation history)."""


def redis_acl(login: Login, keys: str = REDIS_KEYS) -> str:
    """A Redis ACL file for the daemons' login: the default user off (no anonymous client), theirs
    on for their keys and every command but the @dangerous ones (CONFIG, FLUSHALL, DEBUG, ...). The
    password is written as its SHA-256 (`#<hex>`), so the file gives no one the password."""
    if not login.user or login.user == "default":
        raise ValueError("redis ACL: the daemons' login needs a user name of its own (user:password)")
    digest = hashlib.sha256(login.password.encode()).hexdigest()
    return f"user default off\nuser {login.user} on #{digest} {keys} &* +@all -@dangerous\n"


def new_login(user: str) -> Login:
    """A fresh login with a random password (`faas-gpu datastore enable-auth` makes the daemons')."""
    return Login(user, secrets.token_urlsafe(32), "a new login")
