"""Job slowdown over MIG slices shared through MPS (PROTEAN §3, Eq. 2).

    eta = RDF(model, slice) x max(FBR_k + sum_i FBR_i, 1)

RDF (resource deficiency factor) is how much slower a batch runs alone on a slice than on the
whole GPU (7g); FBR (fractional bandwidth requirement) is the share of the GPU's memory
bandwidth a batch needs, so co-located batches slow each other once their FBRs add past 1.
Strict batches go to the slice with the least eta (Job Distribution, `distribution.py`).

RDF comes from a batch's *width* w (the share of the GPU's SMs it keeps busy alone):
RDF = max(1, w / f) on a slice of compute fraction f. Widths are calibrated on the MLPerf
A100 figures (whole GPU vs 1g) and interpolated in the batch's work for other models; FBRs
are assumed. Every such number, and why, is in `assumptions.yaml` (`faas_gpu/policy_data/`, read by
`faas_gpu.policy_data.protean`, which hands the parsed data to `assumptions_from_data`). Measured
numbers (`faas-gpu profile-colocation`) come as an overlay file, `base: package`, laid over that
file (`merge_assumptions`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .mig import GpuModel

MODEL_KEYS = ("domain", "class", "batch", "gmac", "exec_7g_ms", "mem_gb", "fbr")


def eta(rdf: float, fbr: float, co_located_fbrs: Iterable[float] = ()) -> float:
    """Eq. 2: the slowdown of a batch with `fbr` on a slice where it has `rdf`, beside `co_located_fbrs`."""
    if rdf <= 0:
        raise ValueError(f"rdf: must be > 0, got {rdf}")
    return rdf * max(fbr + sum(co_located_fbrs), 1.0)


def eta_with_sm_share(rdf: float, fbr: float, demand: float, co_located: Iterable[tuple[float, float]] = ()) -> float:
    """Eq. 2 with Solo time taken at the batch's MPS share of the slice's SMs (our extension).

    `demand` and each co-located (demand, fbr): the share of the slice's SMs a batch keeps busy
    alone. When the batches on a slice ask for more SMs than it has, MPS shares them and each
    runs that much longer, on top of Eq. 2's bandwidth term.
    """
    co = list(co_located)
    return rdf * max(1.0, demand + sum(d for d, _ in co)) * max(fbr + sum(f for _, f in co), 1.0)


def rdf_of_width(width: float, compute_fraction: float) -> float:
    """A batch that keeps `width` of the GPU busy runs max(1, width / f) slower on a slice of fraction f."""
    if not 0 < compute_fraction <= 1:
        raise ValueError(f"compute_fraction: must be in (0, 1], got {compute_fraction}")
    return max(1.0, width / compute_fraction)


@dataclass(frozen=True)
class WidthAnchor:
    """Two calibration points of one model: width w_lo at work_lo, saturation (w = 1) at work_hi."""

    w_lo: float
    work_lo_gmac: float
    work_hi_gmac: float

    def width(self, work_gmac: float) -> float:
        """Log-linear in work between the anchors, clipped to [0.05, 1]."""
        x = math.log(work_gmac / self.work_lo_gmac) / math.log(self.work_hi_gmac / self.work_lo_gmac)
        return min(1.0, max(0.05, self.w_lo + (1.0 - self.w_lo) * x))


def width_from_rdf_1g(rdf_1g: float, compute_slices: int = 7) -> float:
    """Invert RDF_1g = w / (1/7): the MLPerf slice-vs-whole ratio gives the width."""
    return rdf_1g / compute_slices


def mlperf_rdf_1g(rows: Iterable[Mapping[str, str]]) -> dict[str, dict[str, float]]:
    """RDF of the 1g slice per model and scenario from the MLPerf calibration CSV's rows.

    Offline (throughput): whole / slice; SingleStream (latency): slice / whole.
    """
    values: dict[tuple[str, str, bool], float] = {}
    for r in rows:
        values[(r["model"], r["scenario"], "MIG" in r["system"])] = float(r["value"])
    out: dict[str, dict[str, float]] = {}
    for (model, scenario, on_slice), v in values.items():
        if on_slice or (model, scenario, True) not in values:
            continue
        s = values[(model, scenario, True)]
        out.setdefault(model, {})[scenario] = v / s if scenario == "Offline" else s / v
    return out


@dataclass(frozen=True)
class ModelSpec:
    """One model at its serving batch size."""

    name: str
    domain: str  # "vision" | "language"
    interference: str  # "LI" | "HI" | "VHI"
    batch: int
    gmac: float  # work per item
    exec_7g_s: float  # batch execution time alone on the whole GPU
    mem_mb: float  # GPU memory of one batch
    fbr: float
    width: float

    @property
    def work_gmac(self) -> float:
        return self.batch * self.gmac


@dataclass
class SlowdownModel:
    """RDF per (model, slice), FBR per model, and Eq. 2 over them, for one GPU model."""

    gpu: GpuModel
    models: Mapping[str, ModelSpec]
    rdf_overrides: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def spec(self, model: str) -> ModelSpec:
        try:
            return self.models[model]
        except KeyError:
            raise KeyError(f"no slowdown profile for model {model!r} (known: {', '.join(self.models)})") from None

    def rdf(self, model: str, profile: str) -> float:
        key = self.gpu.profile(profile).key
        if (model, key) in self.rdf_overrides:
            return self.rdf_overrides[(model, key)]
        return rdf_of_width(self.spec(model).width, self.gpu.compute_fraction(key))

    def fbr(self, model: str) -> float:
        return self.spec(model).fbr

    def compute_demand(self, model: str, profile: str) -> float:
        """Share of the slice's SMs the batch keeps busy alone: min(1, w / f)."""
        return min(1.0, self.spec(model).width / self.gpu.compute_fraction(profile))

    def solo_s(self, model: str, profile: str) -> float:
        return self.spec(model).exec_7g_s * self.rdf(model, profile)

    def eta(
        self,
        model: str,
        profile: str,
        co_located: Iterable[str] = (),
        extra_fbr: float = 0.0,
        *,
        sm_share: bool = False,
        extra_demand: float = 0.0,
    ) -> float:
        """Eq. 2 for `model` on `profile` beside the batches of `co_located` models (+ expected extra load).

        `sm_share`: also count SM oversubscription (`eta_with_sm_share`); the paper's Eq. 2 does not.
        """
        co = list(co_located)
        if not sm_share:
            return eta(self.rdf(model, profile), self.fbr(model), [*(self.fbr(m) for m in co), extra_fbr])
        pairs = [(self.compute_demand(m, profile), self.fbr(m)) for m in co] + [(extra_demand, extra_fbr)]
        return eta_with_sm_share(self.rdf(model, profile), self.fbr(model), self.compute_demand(model, profile), pairs)


@dataclass(frozen=True)
class Assumptions:
    """`assumptions.yaml`, parsed: the slowdown model plus the named settings of policies and simulator."""

    slowdown: SlowdownModel
    slo_factor: float
    policy: Mapping[str, Any]
    simulator: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def models(self) -> Mapping[str, ModelSpec]:
        return self.slowdown.models

    def setting(self, section: str, name: str) -> Any:
        """The `value` of a named setting (e.g. ("policy", "wait_limit"))."""
        entry = getattr(self, section)[name]
        return entry["value"] if isinstance(entry, Mapping) and "value" in entry else entry


def _number(entry: Any) -> float:
    """A bare number, or the `value` of `{value: 1.7, source: measured, ...}`."""
    return float(entry["value"] if isinstance(entry, Mapping) else entry)


def merge_assumptions(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`overlay` laid over `base`: mappings merge key by key (so a model entry's `fbr` is replaced and
    its other keys kept, an `rdf` entry added), anything else is replaced. Neither input is changed."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_assumptions(out[key], value)
        else:
            out[key] = value
    return out


def assumptions_from_data(data: Mapping[str, Any], gpu: GpuModel) -> Assumptions:
    """The assumptions in `data`, a whole file like the package's `assumptions.yaml` once parsed (an
    overlay already laid over its base), for `gpu`. Reading and overlaying the files is the loader's
    job (`faas_gpu.policy_data.protean.parse_assumptions`): this function only turns data into the model."""
    anchors = {
        domain: WidthAnchor(float(a["w_lo"]), float(a["work_lo_gmac"]), float(a["work_hi_gmac"]))
        for domain, a in data["calibration"]["width_anchors"].items()
    }
    models = {}
    for name, m in data["models"].items():
        missing = [k for k in MODEL_KEYS if k not in m]
        if missing:
            raise ValueError(
                f"models.{name}: missing {', '.join(missing)} (an overlay can only update the models of its base)"
            )
        work = int(m["batch"]) * float(m["gmac"])
        if "width" in m:
            width = float(m["width"])
        elif m["domain"] in anchors:
            width = anchors[m["domain"]].width(work)
        else:
            raise ValueError(f"models.{name}: no width and no calibration anchor for domain {m['domain']!r}")
        if not 0 < _number(m["fbr"]):
            raise ValueError(f"models.{name}.fbr: must be > 0")
        models[name] = ModelSpec(
            name=name,
            domain=m["domain"],
            interference=m["class"],
            batch=int(m["batch"]),
            gmac=float(m["gmac"]),
            exec_7g_s=float(m["exec_7g_ms"]) / 1000.0,
            mem_mb=float(m["mem_gb"]) * 1024.0,
            fbr=_number(m["fbr"]),
            width=width,
        )
    overrides = {}
    for key, value in (data.get("rdf") or {}).items():  # "resnet50/3g": 1.7
        model, _, profile = str(key).partition("/")
        overrides[(model, gpu.profile(profile).key)] = _number(value)
    slo = data["slo_factor"]
    return Assumptions(
        slowdown=SlowdownModel(gpu, models, overrides),
        slo_factor=float(slo["value"] if isinstance(slo, Mapping) else slo),
        policy=data.get("policy", {}),
        simulator=data.get("simulator", {}),
        raw=data,
    )
