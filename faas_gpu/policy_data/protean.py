"""PROTEAN's data files, read and handed to the pure policies (`faas_gpu.policies.protean`).

- `mig_profiles.yaml`: the MIG profile tables (A100-40GB, H100-80GB) -> `gpu_models()`, `gpu_model(name)`;
- `assumptions.yaml`: the slowdown model's calibration and every assumed number, with its source ->
  `default_assumptions()`. A measured overlay (`faas-gpu profile-colocation`, the scheduler's
  `--protean-assumptions FILE`) says `base: package` and is laid over that file (`parse_assumptions`).

Both files ship in this package; the policies only ever see the parsed data.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources

import yaml

from faas_gpu.policies.protean.mig import GpuModel, gpu_models_from_data
from faas_gpu.policies.protean.slowdown import Assumptions, assumptions_from_data, merge_assumptions

ASSUMPTIONS_FILE = "assumptions.yaml"
PROFILES_FILE = "mig_profiles.yaml"
PACKAGE_BASE = "package"  # `base: package`: this file overlays the package's assumptions.yaml
DEFAULT_GPU = "A100-40GB"  # the GPU an assumptions file is for when it names none


def _package_text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text()


@functools.lru_cache(maxsize=1)
def gpu_models() -> dict[str, GpuModel]:
    """The GPU models of `mig_profiles.yaml`, by name ("A100-40GB", "H100-80GB")."""
    return parse_profiles(_package_text(PROFILES_FILE))


def parse_profiles(text: str) -> dict[str, GpuModel]:
    """The GPU models of a profile table in `mig_profiles.yaml`'s format."""
    return gpu_models_from_data(yaml.safe_load(text) or {})


def gpu_model(name: str) -> GpuModel:
    """One GPU model of `mig_profiles.yaml`; ValueError naming the known ones when it is not there."""
    try:
        return gpu_models()[name]
    except KeyError:
        raise ValueError(f"unknown GPU model {name!r} (known: {', '.join(gpu_models())})") from None


def parse_assumptions(text: str, gpu: GpuModel | None = None) -> Assumptions:
    """The assumptions in `text`: a whole file like the package's, or an overlay (`base: package`)."""
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError("assumptions: expected a mapping")
    if "base" in data:
        if data["base"] != PACKAGE_BASE:
            raise ValueError(f"base: only {PACKAGE_BASE!r} (the package's assumptions.yaml), got {data['base']!r}")
        data = merge_assumptions(default_assumptions().raw, {k: v for k, v in data.items() if k != "base"})
    return assumptions_from_data(data, gpu or gpu_model(data.get("gpu", DEFAULT_GPU)))


@functools.lru_cache(maxsize=1)
def default_assumptions() -> Assumptions:
    """The package's `assumptions.yaml`."""
    return parse_assumptions(_package_text(ASSUMPTIONS_FILE))
