"""The cluster token: the one secret the daemons share (scheduler, GPU Managers, procurer).

Why core and not a daemon's: whichever daemon starts first on a node creates the token file, the
others read it; when it lived in the GPU Manager's daemon module the scheduler had to import the GPU
Manager's daemon to find it. Functions' replicas never hold it: they get their own tokens
(`faas_gpu.fn_credentials`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

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
