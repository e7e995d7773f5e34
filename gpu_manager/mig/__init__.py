"""MIG geometry control through NVML: slice a GPU into the GPU instances a geometry names.

PROTEAN (seed 000, §2 and §4.4) reconfigures each GPU's *geometry* — the multiset of MIG
profiles it is sliced into, e.g. (4g, 3g) — when its Reconfigurator decides the request mix
calls for it; reconfiguring needs every slice idle. This module is the act, not the decision:
given a GPU index and a list of profile names, it reads the GPU's own GPU-instance profile
table (`nvmlDeviceGetGpuInstanceProfileInfoV` for each `NVML_GPU_INSTANCE_PROFILE_*`, with the
placements `nvmlDeviceGetGpuInstancePossiblePlacements` allows), validates the geometry
against it, plans the fewest changes from the current GPU instances (kept instances stay,
with their MIG device UUIDs), and applies the plan in a safe order: compute instances then GPU
instances destroyed, then GPU instances created at planned placements
(`nvmlDeviceCreateGpuInstanceWithPlacement`) each with one full-slice compute instance. It
never changes MIG mode (that needs a GPU reset and root): a GPU with MIG off is refused.

The NVML module is a parameter (`pynvml` by default) so that tests replace it at this boundary.

The package splits it by role: `planning` (pure: valid geometries, the plan), `reading` (NVML
queries, `describe_gpus`), `privilege` (may this process change geometry), `acting`
(`check_geometry`, `apply_geometry`) and `errors`. Callers use
this package's names (`mig.apply_geometry`, `mig.MigError`, ...).
"""

from .acting import apply_geometry, check_geometry
from .errors import InstancesInUse, MigError, MigModeOff, MigNotPermitted, ProcessesUnseen, UnitsBusy, UnknownGPU
from .planning import Instance, InvalidGeometry, Plan, Profile, plan_geometry, valid_geometries
from .privilege import MigPrivilege, probe_privilege
from .reading import (
    CI_PROFILES,
    GI_PROFILES,
    current_instances,
    describe_gpus,
    handle,
    mig_mode,
    nvml_session,
    read_profiles,
)

__all__ = [
    "CI_PROFILES",
    "GI_PROFILES",
    "Instance",
    "InstancesInUse",
    "InvalidGeometry",
    "MigError",
    "MigModeOff",
    "MigNotPermitted",
    "ProcessesUnseen",
    "MigPrivilege",
    "Plan",
    "Profile",
    "UnitsBusy",
    "UnknownGPU",
    "apply_geometry",
    "check_geometry",
    "current_instances",
    "describe_gpus",
    "handle",
    "mig_mode",
    "nvml_session",
    "plan_geometry",
    "probe_privilege",
    "read_profiles",
    "valid_geometries",
]
