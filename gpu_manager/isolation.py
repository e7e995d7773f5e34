"""The model workers' walls: what a worker may see and do, so that a bug in torch's loaders or
kernels, reached by an uploaded artifact, gains nothing (issue 41).

The checks of `faas_gpu.models` are the first wall; this is the second. Each worker process,
pooled or fresh, enters `faas_gpu.walls`'s walls before it reads anything uploaded:

- **an unprivileged uid** (`--worker-user`, default 64999:64999) when the manager runs as root,
  no capability, `no_new_privs`, not dumpable, a seccomp filter (x86-64);
- **no network**: a network namespace of its own, nothing in it. The worker talks to the manager
  over its inherited pipe and the memory file passed over it (`handover.py`), neither of which
  is the network; etcd, Redis, the scheduler and every daemon on loopback are out of reach;
- **nothing of the state folder**: the folder (secrets, the embedded datastore, logs, the other
  daemons' stores) is an empty read-only tmpfs in the worker's view, with only the model store
  shown again, read-only (pooled and prepared workers open artifacts by path after they start;
  the store gives its files to the worker's group, `ModelStore(reader_gid=...)`);
- **no write outside its scratch**: every mount read-only, /tmp and /dev/shm private tmpfs;
- a clean environment (`KEEP_ENV`), and /proc showing no other uid's processes.

On a GPU the device nodes stay usable (a read-only mount refuses writes to files, not device
I/O), and so do /proc/driver/nvidia and /sys. With `--mps` the worker keeps the manager's uid
(root) and the host's IPC namespace and /dev/shm: an MPS server runs as its clients' uid and
shares memory with them through /dev/shm, and the unit's MPS folders are the manager's; the MPS
folder is shown writable. The other walls stand. Neither GPU case is tested here (no GPU):
docs/GPU.md's suite is where they are.

When the manager is not root, the same namespaces are made in a user namespace of the worker's
own; where the kernel refuses that too, the workers run with the walls that need no privilege,
and the manager says so plainly at start (`--worker-sandbox on` refuses to start instead;
`off` builds none, and says so).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from faas_gpu.walls import Isolation, SandboxError, Walls, probe

log = logging.getLogger(__name__)

WORKER_USER = (64999, 64999)
"""The uid and gid of model workers under a root manager: owned by nothing else on the node."""
KEEP_ENV = (
    "PATH", "LANG", "LANGUAGE", "TZ", "LC_", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    "CUDA_", "NVIDIA_", "OMP_", "MKL_", "KMP_", "TORCH_", "PYTORCH_", "FAAS_GPU_OPTIMIZE",
)  # fmt: skip
MODES = ("auto", "on", "off")


def parse_user(value: str) -> tuple[int, int]:
    """`UID` or `UID:GID` (numbers, not 0): the workers' identity."""
    uid, _, gid = value.partition(":")
    try:
        ids = (int(uid), int(gid or uid))
    except ValueError:
        raise ValueError(f"--worker-user: {value!r} is not UID or UID:GID") from None
    if min(ids) <= 0:
        raise ValueError(f"--worker-user: {value!r}: the workers may not run as root")
    return ids


def code_paths() -> tuple[str, ...]:
    """What the worker's interpreter reads: its own installation and every import path."""
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    found += [p for p in sys.path if p]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found if os.path.exists(p)))


def worker_walls(
    home: Path, store: Path, mps: Path | None = None, mode: str = "auto", user: tuple[int, int] = WORKER_USER
) -> Walls | None:
    """The walls of this manager's workers (None for `off`)."""
    if mode not in MODES:
        raise ValueError(f"--worker-sandbox: one of {', '.join(MODES)}, not {mode!r}")
    if mode == "off":
        return None
    hide = [str(home)]
    if os.geteuid() != 0 and Path.home().is_dir() and str(Path.home()) != "/":
        hide.append(str(Path.home()))  # the same uid as the manager outside: its own files go too
    uid, gid = (None, None) if mps is not None else user
    return Walls(
        uid=uid,
        gid=gid,
        hide=tuple(hide),
        read_only=(str(store), *code_paths()),
        writable=(str(mps), "/dev/shm") if mps is not None else (),
        scratch=("/tmp",) if mps is not None else ("/tmp", "/dev/shm"),
        ipc=mps is not None,
        keep_env=KEEP_ENV,
        required=mode == "on",
    )


def checked(walls: Walls | None, mode: str) -> tuple[Walls | None, Isolation | None]:
    """The walls tried in a throwaway child before any worker starts, and said plainly in the log:
    what the workers will have, or that they are not isolated. `on` and walls that cannot be built
    at all: SystemExit; `auto`: the workers run without them (and the log says so)."""
    if walls is None:
        log.warning("model workers are NOT isolated (--worker-sandbox off): they run as this manager's user")
        return None, None
    try:
        isolation = probe(walls)
    except SandboxError as exc:
        if mode == "on":
            raise SystemExit(f"gpu-manager: --worker-sandbox on, but {exc}") from None
        log.warning("model workers are NOT isolated: %s; they run as this manager's user, with its network", exc)
        return None, None
    if isolation.isolated:
        log.info("model workers isolated: %s", isolation.describe())
    else:
        log.warning("model workers are only partly isolated: %s", isolation.describe())
    if isolation.uid == 0 and walls.ipc:
        log.warning("with --mps the model workers keep uid 0, without capabilities: MPS serves a client as its uid")
    return walls, isolation
