"""INFless itself as a serving system of the simulation (the paper's §3, Table 3's "INFless" and
its ablations): the dispatcher, Algorithm 1 and a keep-alive policy, driven, not re-implemented."""

from __future__ import annotations

from faas_gpu.policies.infless import (
    InstanceLoad,
    KeepAlivePolicy,
    LongShortTermHistogram,
    RateWindow,
    Windows,
    dispatch,
    rate_window,
    schedule,
    warm,
)
from faas_gpu.policies.infless.keepalive import MINUTE

from ..infless_data import candidates
from .model import MIN_AGE_S, Function, Instance, Platform


class INFlessSystem:
    """Drives the dispatcher, Algorithm 1 and a keep-alive policy; none of them is re-implemented.

    Released instances (the dispatcher's case iii) stop taking load and stay idle, still holding
    their resources, for LSTH's keep-alive window (they are unloaded at once when the window has a
    pre-warm gap): the "dynamic keep-alive" of Table 3, against the baselines' fixed 300 s. A
    scale-up revives idle instances first (batches that still fill: R >= r_low), then calls
    Algorithm 1 for what is left. A function with no instance at all is pre-warmed as the
    provider does (one instance, inside the window after the last active minute).
    """

    def __init__(
        self,
        sim: Platform,
        name: str = "INFless",
        *,
        offset: float = 1.10,
        batches: set[int] | None = None,
        select: str = "efficiency",
        keepalive: KeepAlivePolicy | None = None,
        alpha: float = 0.8,
    ):
        self.sim, self.name, self.select, self.alpha = sim, name, select, alpha
        self.keepalive = keepalive or LongShortTermHistogram()
        self.cands = {f.name: candidates(f.rows, offset=offset, batches=batches) for f in sim.functions.values()}
        self.rates: dict[str, dict] = {}
        self.idle: dict[int, float] = {}  # instance id -> released at
        self._windows: dict[tuple[str, int], Windows] = {}
        self.windows: dict[str, RateWindow] = {}  # the provider's rate measurement, per function
        self.arrived: dict[str, float] = {}  # requests counted so far, per function
        self.last_call: dict[str, float] = {}  # when the last step with requests was counted

    def _window(self, fn: Function, now: float) -> Windows | None:
        minutes = self.sim.active[fn.name]
        if not minutes:
            return None
        key = (fn.name, int(now // MINUTE))
        if key not in self._windows:
            self._windows[key] = self.keepalive.windows(minutes, key[1])
        return self._windows[key]

    def _warm_window(self, fn: Function, w: Windows | None, now: float) -> bool:
        """The provider's rule (`keepalive.warm`) after the function's last active minute, its window
        counted from the last call as the provider counts it. Nothing waits at a gateway here:
        requests that find no warm instance are counted as cold at once (`Simulation._serve`)."""
        last_call = self.last_call.get(fn.name)
        since_call = None if last_call is None else now - last_call
        return w is not None and warm(
            w, now - self.sim.active[fn.name][-1] * MINUTE, since_call_s=since_call, in_flight=0
        )

    def measure(self, fn: Function, step_rps: float, now: float) -> float:
        """The rate the provider would scale on: its `RateWindow` fed the arrivals counted so far
        (the last step brought `step_rps` requests per second for one second), not the step's
        true rate."""
        self.arrived[fn.name] = self.arrived.get(fn.name, 0.0) + step_rps
        window = self.windows.setdefault(fn.name, rate_window())
        return window.observe(now, self.arrived[fn.name])

    def _place(self, fn: Function, rps: float, now: float, limit: int | None = None) -> float:
        res = schedule(
            rps,
            self.cands[fn.name],
            self.sim.cluster.free(),
            fn.slo_s,
            beta=self.sim.beta,
            select=self.select,
            max_instances=limit,
        )
        for p in res.placements:
            c = p.candidate
            self.sim.start(fn, c.batch, c.cpu, c.gpu, p.server, p.gpu_index, now, p.r_low, p.r_up, p.timeout_s)
        return res.unplaced_rps

    def control(self, fn: Function, rps: float, now: float) -> None:
        """One control period: `rps` is the last step's arrival rate, measured as the provider does."""
        if rps > 0:
            self.last_call[fn.name] = now
        rps = self.measure(fn, rps, now)
        w = self._window(fn, now)
        every = self.sim.instances[fn.name]
        for i in [i for i in every if i.id in self.idle]:
            if w is None or w.prewarm_s > 0 or now - self.idle[i.id] > w.keepalive_s:
                del self.idle[i.id]
                self.sim.stop(i)
        live = [i for i in self.sim.instances[fn.name] if i.id not in self.idle]
        d = dispatch([InstanceLoad(i.id, i.r_low, i.r_up) for i in live], rps, alpha=self.alpha)
        self.sim.short[fn.name] = False
        if d.case == "scale-up":
            residual = d.scale_up_rps
            for i in sorted((i for i in self.sim.instances[fn.name] if i.id in self.idle), key=lambda i: -i.r_up):
                if residual <= 1e-9:
                    break
                if i.batch == 1 or residual >= i.r_low:
                    del self.idle[i.id]
                    residual -= i.r_up
            if residual > 1e-9:
                self.sim.short[fn.name] = self._place(fn, residual, now) > 1e-9
        elif d.case == "release":
            gone = set(d.release)
            for i in live:
                if i.id in gone and now - i.created_s >= MIN_AGE_S:
                    self.idle[i.id] = now
        if rps <= 0 and not self.sim.instances[fn.name] and self._warm_window(fn, w, now):
            self._place(fn, 1e-6, now, limit=1)  # pre-warm before the predicted arrival
        live = [i for i in self.sim.instances[fn.name] if i.id not in self.idle]
        loads = [InstanceLoad(i.id, i.r_low, i.r_up) for i in live]
        self.rates[fn.name] = dispatch(loads, rps, alpha=self.alpha, keep=len(live)).rates

    def weights(self, fn: Function, warm: list[Instance], lam: float) -> list[float]:
        """The dispatcher's rates; with none yet (no load was measured), live instances by r_up, and
        idle ones only when nothing else is warm (the gateway sends requests to any warm replica)."""
        rates = self.rates.get(fn.name, {})
        w = [rates.get(i.id, 0.0) for i in warm]
        if sum(w) > 0:
            return w
        live = [0.0 if i.id in self.idle else i.r_up for i in warm]
        return live if sum(live) > 0 else [i.r_up for i in warm]

    def capacity(self, fn: Function, inst: Instance, lam: float) -> float:
        return inst.batch / inst.t_s
