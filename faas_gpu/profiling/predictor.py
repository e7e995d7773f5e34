"""INFless's latency predictor (§3.3): t_exec = f(batch, CPU, GPU share) for the scaling policies.

Sources, in order, for one configuration:
1. the model's operator graph with every operator profiled there, combined (graph.OpGraph.combine)
   and raised by `offset` (10% in the paper, "to reduce the risk of SLO violations from
   prediction errors");
2. the model measured end to end at that configuration (store.model_profiles), as measured;
3. INFless's own profile files (`<model>-profile-results.txt`) when a folder of them is given;
else MissingProfile. A GPU share of 0 means the CPU; a share > 0 means cuda at that % of SMs.

`prefer_measured` puts (2) before (1) where both exist: what the planner and the path profile
use (issue 20). Operator medians add up per-operator overheads and lose the cache effects of a
whole run, so their sum overstates small batches and understates large ones (ResNetMini on this
machine: batch 8 predicted 10 ms against 7–8 measured, batch 32 29 against 39), and Algorithm 1,
which compares batch sizes, then picks a batch that serves less. The combination stays what
predicts the configurations nobody measured, and what `benchmarks/cop_accuracy.py` judges.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from faas_gpu.infless_profiles import INFEASIBLE_MS, PROFILE_SUFFIX, load_profile

from .store import ProfileStore

__all__ = ["INFEASIBLE_MS", "Estimate", "LatencyPredictor", "MissingProfile", "load_infless_profiles"]

INFLESS_SUFFIX = PROFILE_SUFFIX

InflessProfiles = dict[str, dict[tuple[int, int, int], float]]


class MissingProfile(LookupError):
    """No source knows this model (or this configuration of it); the message says how to profile it."""

    def __init__(self, model: str, where: str = ""):
        self.model = model
        q = shlex.quote(model)
        super().__init__(
            f"no profile for model {model!r}{where}: run `faas-gpu profile --model MODULE:FACTORY "
            f"--input-shape SHAPE --name {q}` (or `faas-gpu profile -f stack.yml` for a function whose "
            f"annotations com.faas-gpu.model-source and com.faas-gpu.input-shape name it)"
        )

    def __str__(self) -> str:
        return str(self.args[0])


def load_infless_profiles(directory: Path | str) -> InflessProfiles:
    """INFless's profile files: model -> {(cpu threads, GPU SM %, batch): ms}; infeasible rows left out."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such folder of INFless profiles (<model>{INFLESS_SUFFIX})")
    out: InflessProfiles = {}
    for path in sorted(directory.glob(f"*{INFLESS_SUFFIX}")):
        rows = out.setdefault(path.name.removesuffix(INFLESS_SUFFIX), {})
        for r in load_profile(path):
            if r.feasible:
                rows[(r.cpu, r.gpu, r.batch)] = r.ms
    return out


@dataclass(frozen=True)
class Estimate:
    ms: float
    source: str  # "operators" | "measured" | "infless"


class LatencyPredictor:
    def __init__(
        self,
        store: ProfileStore,
        offset: float = 0.10,
        infless_dir: Path | None = None,
        prefer_measured: bool = False,
    ):
        if not offset >= 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self.store = store
        self.offset = offset
        self.prefer_measured = prefer_measured
        self.infless = load_infless_profiles(infless_dir) if infless_dir is not None else {}

    @staticmethod
    def _device(gpu_share: int) -> str:
        return "cuda" if gpu_share > 0 else "cpu"

    def estimate(self, model: str, batch: int, cpu: int, gpu_share: int = 0) -> Estimate | None:
        """The first source that knows this configuration, or None."""
        if batch < 1 or cpu < 1 or not 0 <= gpu_share <= 100:
            raise ValueError(f"need batch >= 1, cpu >= 1 and 0 <= gpu_share <= 100, got {batch}, {cpu}, {gpu_share}")
        device = self._device(gpu_share)
        if self.prefer_measured:
            measured = self.store.model_ms(model, batch, cpu, device, gpu_share)
            if measured is not None:
                return Estimate(measured, "measured")
        graph = self.store.graph(model)
        if graph is not None:
            ops = self.store.ops_at(graph.signatures, batch, cpu, device, gpu_share)
            if ops.keys() == graph.signatures:
                return Estimate(graph.combine(ops) * (1 + self.offset), "operators")
        measured = self.store.model_ms(model, batch, cpu, device, gpu_share)
        if measured is not None:
            return Estimate(measured, "measured")
        ms = self.infless.get(model, {}).get((cpu, gpu_share, batch))
        return Estimate(ms, "infless") if ms is not None else None

    def predict_ms(self, model: str, batch: int, cpu: int, gpu_share: int = 0) -> float:
        est = self.estimate(model, batch, cpu, gpu_share)
        if est is None:
            where = f" at batch {batch}, {cpu} CPU threads, " + (f"{gpu_share}% GPU" if gpu_share else "no GPU")
            raise MissingProfile(model, where if self.has(model) else "")
        return est.ms

    def estimates(self, model: str, gpu: bool = False) -> dict[tuple[int, int, int], Estimate]:
        """(batch, cpu, gpu share) -> Estimate for every configuration some source knows."""
        out: dict[tuple[int, int, int], Estimate] = {}
        for (cpu, sm, batch), ms in self.infless.get(model, {}).items():
            out[(batch, cpu, sm)] = Estimate(ms, "infless")
        measured = {
            (batch, cpu, share): Estimate(ms, "measured")
            for (batch, cpu, _device, share), ms in self.store.model_profiles(model).items()
        }
        combined = {}
        graph = self.store.graph(model)
        if graph is not None:
            sigs = graph.signatures
            for (batch, cpu, _device, share), ops in self.store.op_configs(sigs).items():
                if ops.keys() == sigs:
                    combined[(batch, cpu, share)] = Estimate(graph.combine(ops) * (1 + self.offset), "operators")
        # the same order as `estimate`: the later source wins a configuration both know
        out.update(combined | measured if self.prefer_measured else measured | combined)
        return {k: v for k, v in out.items() if gpu or k[2] == 0}

    def configs(self, model: str, gpu: bool = False) -> list[tuple[int, int, int, float]]:
        """Every profiled (batch, cpu threads, gpu share %, predicted ms); CPU-only ones unless `gpu`."""
        rows = sorted((b, c, g, e.ms) for (b, c, g), e in self.estimates(model, gpu).items())
        if not rows:
            raise MissingProfile(model)
        return rows

    def path_cost(self, node: str = "local") -> tuple[float, float] | None:
        """The serving path's own cost on `node`: (fixed ms per batch, ms per request), or None
        when `faas-gpu profile --path` has not measured it."""
        return self.store.path_cost(node)

    def has(self, model: str) -> bool:
        return bool(self.estimates(model, gpu=True))
