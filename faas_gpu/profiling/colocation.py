"""PROTEAN's RDF and FBR (§3, Eq. 1-2) fitted from co-location measurements: pure functions.

The timing is in `colocation_runner.py`; this module only turns measured times into numbers for
the slowdown model (`faas_gpu.policies.protean.slowdown`) and writes them as an overlay of its
`assumptions.yaml`, so it is unit-tested on synthetic curves.

RDF(model, slice) = Solo(slice) / Solo(whole GPU), the paper's definition.

FBR from a co-location curve. Eq. 1 for the measured batch beside k co-runners of FBR c is
T_k / T_0 = max(f + k c, 1); with k identical copies (c = f), T_k / T_0 = max((k + 1) f, 1). As the
paper does ("averaging the values obtained from solving the linear equations derived from Eq. 1
for multiple co-locations"), every point past the knee (T_k / T_0 > 1 + `knee`) is solved for f:
f_k = T_k / T_0 - k c (identical copies: T_k / T_0 / (k + 1)), and FBR is their mean. The fit is
then checked against the whole curve, points before the knee included, and refused with a named
reason when it does not hold:

- no point past the knee: the copies did not slow each other; FBR < 1 / (K + 1) is all we know;
- a residual above `tolerance`: the curve is not Eq. 1's shape (e.g. a constant cost per
  co-runner, 1 + a k, is interference Eq. 1 does not model);
- a point below 1 - `knee`: the batch ran faster beside co-runners (noise, warm-up);
- a point with f_k > 1 + `tolerance`: slower than serial, the device is oversubscribed;
- FBR >= `serial`: the copies ran one after another (T_k = (k + 1) T_0). That is compute
  sharing, time-slicing without MPS or a batch that alone fills the device, not bandwidth.

The assumption behind the estimator: the curve cannot tell bandwidth from SM sharing (a batch
that keeps a share d of the SMs busy gives max((k + 1) d, 1) too). Like the paper we read the
slowdown of co-located MPS batches as bandwidth; the `serial` refusal catches the clear case of
compute, and a batch narrower than the device (MPS on, measured with the serving batch) is what
keeps the rest bandwidth.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KNEE = 0.05  # T_k / T_0 within 5% of 1: no slowdown (run-to-run noise of a median)
TOLERANCE = 0.15  # largest relative residual of the fitted curve
SERIAL = 0.9  # FBR this close to 1: the copies serialized; compute, not bandwidth
RDF_FLOOR = 0.95  # a slice more than 5% faster than the whole GPU: noise


def median_s(times: Sequence[float]) -> float:
    """The solo time of a device: the median batch time, robust to a stray slow batch."""
    if not times or min(times) <= 0:
        raise ValueError(f"times: expected positive batch times, got {list(times)!r}")
    return float(statistics.median(times))


@dataclass(frozen=True)
class Fit:
    """A fitted number, or None and the reason it was refused."""

    value: float | None
    reason: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.value is not None


def fit_rdf(solo_slice_s: float, solo_whole_s: float, floor: float = RDF_FLOOR) -> Fit:
    """RDF = Solo(slice) / Solo(whole); refused when the slice ran clearly faster than the whole GPU."""
    if solo_slice_s <= 0 or solo_whole_s <= 0:
        raise ValueError("solo times must be > 0")
    ratio = solo_slice_s / solo_whole_s
    if ratio < floor:
        return Fit(None, f"the slice ran {1 / ratio:.2f}x faster than the whole device: noise; more --repeat")
    return Fit(max(ratio, 1.0), detail={"ratio": ratio})


def fit_fbr(
    ratios: Mapping[int, float],
    corunner_fbr: float | None = None,
    *,
    knee: float = KNEE,
    tolerance: float = TOLERANCE,
    serial: float = SERIAL,
) -> Fit:
    """FBR from {k: T_k / T_0} (k co-runners beside the measured batch) under Eq. 1 (see the module).

    `corunner_fbr`: the co-runners' FBR when they are another model; None when they are copies.
    """
    points = sorted((int(k), float(r)) for k, r in ratios.items() if int(k) >= 1)
    if not points:
        raise ValueError("ratios: expected T_k / T_0 for k >= 1 co-runners")
    detail: dict[str, Any] = {"ratios": {k: round(r, 4) for k, r in points}}
    low = [k for k, r in points if r < 1 - knee]
    if low:
        return Fit(None, f"ran faster beside {low[0]} co-runner(s) than alone: noise or warm-up; more --repeat", detail)
    past = [(k, r) for k, r in points if r > 1 + knee]
    if not past:
        kmax = points[-1][0]
        if corunner_fbr is None:
            bound = f"FBR < {1 / (kmax + 1):.3g}"
        else:
            bound = f"FBR < {max(0.0, 1 - kmax * corunner_fbr):.3g}"
        return Fit(None, f"no slowdown up to {kmax} co-runners: {bound}; add co-runners (--max-corunners)", detail)

    def solve(k: int, r: float) -> float:
        return r / (k + 1) if corunner_fbr is None else r - k * corunner_fbr

    f = statistics.fmean(solve(k, r) for k, r in past)
    detail["per_point"] = {k: round(solve(k, r), 4) for k, r in past}
    if f <= 0:
        return Fit(None, f"the co-runners' FBR {corunner_fbr} alone explains the slowdown (f = {f:.3g})", detail)
    over = [k for k, v in detail["per_point"].items() if v > 1 + tolerance]
    if over:
        return Fit(
            None,
            f"slower than running one after another beside {over[0]} co-runner(s) (FBR > 1): the device is "
            "oversubscribed (e.g. CPU threads beyond its cores), not sharing bandwidth",
            detail,
        )
    c = f if corunner_fbr is None else corunner_fbr
    worst_k, worst = max(((k, abs(max(f + k * c, 1.0) - r) / r) for k, r in points), key=lambda p: p[1])
    detail["max_residual"] = round(worst, 4)
    if worst > tolerance:
        return Fit(
            None,
            f"the curve does not fit Eq. 1: with FBR {f:.3g} it is {worst:.0%} off at {worst_k} co-runner(s) "
            f"(allowed {tolerance:.0%})",
            detail,
        )
    if f >= serial:
        return Fit(
            None,
            f"compute-limited: the copies serialize (FBR {f:.3g} >= {serial}); time-slicing without MPS, or a "
            "batch that fills the device alone, measures compute sharing, not bandwidth",
            detail,
        )
    return Fit(f, detail=detail)


# -- the overlay of assumptions.yaml -----------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """Where and when numbers were measured, written beside each of them."""

    device: str  # e.g. "NVIDIA A100-SXM4-40GB MIG 3g.20gb (MIG-...)" or "cpu, 2 threads"
    date: str  # ISO date
    batch: int
    repeat: int


def overlay(
    model: str,
    rdfs: Mapping[str, tuple[Fit, Measurement]],
    fbr: tuple[Fit, Measurement] | None,
    gpu: str | None = None,
) -> dict[str, Any]:
    """The overlay (`base: package`) with the numbers that fitted; refusals go in `refused:`."""
    out: dict[str, Any] = {"base": "package"}
    if gpu:
        out["gpu"] = gpu
    refused: dict[str, str] = {}
    rdf: dict[str, Any] = {}
    for profile, (fit, m) in rdfs.items():
        key = f"{model}/{profile}"
        if fit.ok:
            rdf[key] = {"value": round(float(fit.value or 0), 4), "source": "measured", **_where(m)}
        else:
            refused[f"rdf.{key}"] = fit.reason
    if rdf:
        out["rdf"] = rdf
    if fbr is not None:
        fit, m = fbr
        if fit.ok:
            curve = {int(k): float(v) for k, v in fit.detail.get("ratios", {}).items()}
            out["models"] = {
                model: {
                    "fbr": {"value": round(float(fit.value or 0), 4), "source": "measured", **_where(m), "curve": curve}
                }
            }
        else:
            refused[f"models.{model}.fbr"] = fit.reason
    if refused:
        out["refused"] = refused
    return out


def _where(m: Measurement) -> dict[str, Any]:
    return {"device": m.device, "date": m.date, "batch": m.batch, "repeat": m.repeat}


def merge_overlays(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`new` over an overlay written before (other models' entries kept; this model's refusals reset)."""
    from faas_gpu.policies.protean.slowdown import merge_assumptions

    out = merge_assumptions(old, {k: v for k, v in new.items() if k != "refused"})
    refused = {k: v for k, v in (old.get("refused") or {}).items() if not _same_model(k, new)}
    refused.update(new.get("refused") or {})
    out.pop("refused", None)
    if refused:
        out["refused"] = refused
    return out


def _same_model(refusal_key: str, new: Mapping[str, Any]) -> bool:
    """A refusal of an entry that `new` measured again (found or refused) is dropped."""
    keys = {f"rdf.{k}" for k in new.get("rdf") or {}} | set(new.get("refused") or {})
    keys |= {f"models.{m}.fbr" for m in new.get("models") or {}}
    return refusal_key in keys
