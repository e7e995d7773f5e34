"""Whether this process may create and destroy MIG instances, asked of the OS before anything is drained.

NVIDIA's MIG user guide ("Device Nodes and Capabilities"): creating or destroying GPU and compute
instances needs the `mig-config` nvidia-capability, which root (any process with CAP_SYS_ADMIN)
has implicitly; without it every create/destroy fails with NVML_ERROR_NO_PERMISSION. NVML has no
query that answers this without trying, and trying means draining the GPU first, so the manager
asks the OS instead:

1. CAP_SYS_ADMIN in the process's effective capabilities (`CapEff` in /proc/self/status; root
   has it, a root in a container without it does not);
2. else read access to the mig-config capability's device node: /proc/driver/nvidia/capabilities/
   mig/config names its `DeviceFileMinor`, the node is /dev/nvidia-caps/nvidia-cap<minor>
   (the guide's /dev based interface; the older /proc one is deprecated).

The answer is a hint, not a guarantee: NVML's own NO_PERMISSION during a reconfiguration is
mapped to the same refusal (`MigNotPermitted`) and the manager then remembers the GPU as not
controllable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CAP_SYS_ADMIN = 21  # linux/capability.h
MIG_CONFIG_PROC = "proc/driver/nvidia/capabilities/mig/config"
CAPS_DEV = "dev/nvidia-caps"


@dataclass(frozen=True)
class MigPrivilege:
    """May this process change MIG geometry, and why (or why not), for the log and `GET /v1/gpus`."""

    allowed: bool
    reason: str

    def to_json(self) -> dict:
        return {"mig_control": self.allowed, "mig_control_reason": self.reason}


def _cap_sys_admin(root: Path) -> bool:
    try:
        for line in (root / "proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _mig_config_node(root: Path) -> Path | None:
    try:
        for line in (root / MIG_CONFIG_PROC).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMinor":
                return root / CAPS_DEV / f"nvidia-cap{int(value)}"
    except (OSError, ValueError):
        pass
    return None


def probe_privilege(root: str | Path = "/") -> MigPrivilege:
    """This process's MIG privilege, read from the OS (`root`: a fake file tree in tests)."""
    root = Path(root)
    if _cap_sys_admin(root):
        return MigPrivilege(True, "CAP_SYS_ADMIN (root): every nvidia-capability, mig-config included")
    node = _mig_config_node(root)
    if node is None:
        return MigPrivilege(
            False,
            f"not root (no CAP_SYS_ADMIN) and no mig-config capability ({'/' / Path(MIG_CONFIG_PROC)} unreadable)",
        )
    if os.access(node, os.R_OK):
        return MigPrivilege(True, f"the mig-config capability ({'/' / node.relative_to(root)} readable)")
    return MigPrivilege(
        False, f"not root and the mig-config capability's node {'/' / node.relative_to(root)} is not readable"
    )
