"""OpenFaaS basic auth: credentials in files, checked on every /system/* route."""

from __future__ import annotations

import base64
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

USER_FILE = "basic-auth-user"
PASSWORD_FILE = "basic-auth-password"
REALM_HEADER = ("WWW-Authenticate", 'Basic realm="Restricted"')


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def header(self) -> str:
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return f"Basic {token}"

    def check(self, authorization: str | None) -> bool:
        """True for a matching `Basic` header; `Bearer` (faas-cli with no login) never matches.

        Compared as UTF-8 bytes: `hmac.compare_digest` refuses non-ASCII str with TypeError, which
        turned a header such as `admin:pässword` into a 500 instead of a 401.
        """
        if not authorization or not authorization.startswith("Basic "):
            return False
        try:
            raw = base64.b64decode(authorization[6:].strip())
        except ValueError:
            return False
        user, _, password = raw.partition(b":")
        return hmac.compare_digest(user, self.user.encode()) & hmac.compare_digest(password, self.password.encode())


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def ensure_credentials(secrets_dir: Path) -> Credentials:
    """Read the credentials, generating them (mode 0600) on first start as faasd does.

    When both files exist nothing is written, so a read-only mount (a Kubernetes or Swarm
    secret) works as it is.
    """
    user_path, pw_path = secrets_dir / USER_FILE, secrets_dir / PASSWORD_FILE
    if user_path.exists() and pw_path.exists():
        return read_credentials(secrets_dir)
    secrets_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    if not user_path.exists():
        _write_private(user_path, "admin")
    if not pw_path.exists():
        _write_private(pw_path, secrets.token_urlsafe(24))
    return read_credentials(secrets_dir)


def read_credentials(secrets_dir: Path) -> Credentials:
    """Whitespace-trimmed, as faas-provider's auth/credentials.go reads them."""
    return Credentials(
        (secrets_dir / USER_FILE).read_text().strip(),
        (secrets_dir / PASSWORD_FILE).read_text().strip(),
    )
