"""Where faas-gpu keeps its state: one place for every path under FAAS_GPU_HOME."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"  # traces, profiles, prices beside the checkout


def home() -> Path:
    """State folder: $FAAS_GPU_HOME, else ./.faas-gpu (as faasd keeps /var/lib/faasd)."""
    return Path(os.environ.get("FAAS_GPU_HOME") or Path.cwd() / ".faas-gpu").resolve()


def secrets_dir() -> Path:
    """Basic-auth credentials, as OpenFaaS mounts them (basic-auth-user, basic-auth-password)."""
    return home() / "secrets"


def function_secrets_dir(namespace: str) -> Path:
    """Function secrets, one file per secret, mode 0600."""
    return home() / "function-secrets" / namespace


def images_dir() -> Path:
    """The local image store: one folder per image name built by `faas-gpu build`."""
    return home() / "images"


def logs_dir() -> Path:
    return home() / "logs"


def run_dir() -> Path:
    """Per-replica scratch folders (TMPDIR with the watchdog's lock file)."""
    return home() / "run"


def state_db() -> Path:
    """The embedded datastore's file."""
    return home() / "state.db"
