"""The MIG GPUs, as the GPU Managers' unit reports in the datastore show them.

Only MIG units whose GPU is the assumptions file's GPU model (A100-40GB by default) are
managed: units report their MIG profile and GPU name (the GPU Managers' status reports); the other GPUs are
left out with the reason. Both PROTEAN parts read this: the Reconfigurator (`scheduler.reconfigure`)
re-slices these GPUs, the Job Distribution (`scheduler.distribution`) places on their slices.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from faas_gpu.contract.keys import UNITS as STATUS_PREFIX
from faas_gpu.datastore import Datastore
from faas_gpu.policies.protean.mig import Geometry, GpuModel, InvalidGeometry

from .residency import Gpu


@dataclass(frozen=True)
class GpuView:
    gpu: Gpu
    url: str  # its GPU Manager
    units: tuple[str, ...]  # node/unit keys of its MIG units
    geometry: Geometry  # profile keys, largest first: ("4g", "2g", "1g")
    slice_memory_mb: tuple[tuple[str, float], ...] = ()  # (profile key, memory its manager reports)


def gpu_name_matches(model: str, gpu_name: str | None) -> bool:
    """ "A100-40GB" matches NVML's "NVIDIA A100-SXM4-40GB": every part of the model name is in it."""
    if not gpu_name:
        return False
    name = gpu_name.upper()
    return all(part in name for part in model.upper().split("-") if part)


def read_gpus(ds: Datastore, gpu_model: GpuModel) -> tuple[dict[Gpu, GpuView], dict[Gpu, str]]:
    """The MIG GPUs of `gpu_model` the managers report units of, and why the other GPUs are left out."""
    reports = []
    for kv in ds.get_prefix(STATUS_PREFIX):
        try:
            reports.append(json.loads(kv.value))
        except ValueError:
            continue
    return gpu_views(reports, gpu_model)


def gpu_views(reports: Iterable[Any], gpu_model: GpuModel) -> tuple[dict[Gpu, GpuView], dict[Gpu, str]]:
    """`read_gpus` over unit reports already read (parsed JSON; malformed ones are skipped)."""
    units: dict[Gpu, list[dict[str, Any]]] = defaultdict(list)
    for s in reports:
        try:
            if s.get("kind") == "mig":
                units[(str(s["node"]), int(s["gpu"]))].append(s)
        except (AttributeError, ValueError, KeyError, TypeError):
            continue
    views: dict[Gpu, GpuView] = {}
    skipped: dict[Gpu, str] = {}
    for gpu, reports in units.items():
        names = {r.get("gpu_name") for r in reports}
        if len(names) != 1 or not gpu_name_matches(gpu_model.name, names.pop()):
            skipped[gpu] = f"not an {gpu_model.name} (reports {sorted(map(str, {r.get('gpu_name') for r in reports}))})"
            continue
        if any(not r.get("profile") for r in reports) or len({r.get("url") for r in reports}) != 1:
            skipped[gpu] = "its units report no MIG profile or several managers"
            continue
        try:
            geometry = gpu_model.validate([r["profile"] for r in reports])
        except InvalidGeometry as exc:
            skipped[gpu] = str(exc).split(". Valid")[0]
            continue
        keys = tuple(sorted(f"{r['node']}/{r['unit']}" for r in reports))
        memory = tuple(sorted(_slice_memory(gpu_model, reports)))
        views[gpu] = GpuView(gpu, str(reports[0]["url"]), keys, geometry, memory)
    return views, skipped


def _slice_memory(gpu_model: GpuModel, reports: list[dict[str, Any]]) -> set[tuple[str, float]]:
    """(profile key, reported memory_mb) of each unit that reports a usable figure."""
    out = set()
    for r in reports:
        try:
            mb = float(r["memory_mb"])
            key = gpu_model.profile(r["profile"]).key
        except (KeyError, TypeError, ValueError, InvalidGeometry):
            continue
        if mb > 0:
            out.add((key, mb))
    return out


def slice_memory(views: Iterable[GpuView]) -> dict[str, float]:
    """Per profile key, the least memory any of these GPUs' managers report for it."""
    out: dict[str, float] = {}
    for v in views:
        for key, mb in v.slice_memory_mb:
            out[key] = min(out.get(key, mb), mb)
    return out


def gpu_key(gpu: Gpu) -> str:
    return f"{gpu[0]}/{gpu[1]}"
