"""GPU administration: MPS (each cuda unit's control daemon, a model's share of its SMs, the
workers' environments that join it) and MIG geometry (`reconfigure`, PROTEAN §4.4).

A reconfiguration drains the GPU's units (taken out of placement, their running jobs waited for,
their workers and MPS daemons stopped), applies the geometry through NVML (`mig.apply_geometry`)
and discovers the GPU's units anew.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from faas_gpu.mps import thread_percentage

from . import mig, optimize
from .discovery import UnitInfo, discover_units
from .executors import UnitExecutor
from .jobs import _UnitState
from .mps import MPSControl

log = logging.getLogger("gpu_manager.manager")  # the name it logged under as one module


class Administration:
    """The `GPUManager`'s MPS and MIG administration (a mixin: its state is the manager's,
    declared below). A drained unit's workers are dropped through the job path's `_drop`."""

    units: dict[str, _UnitState]
    executor: UnitExecutor
    nvml: Any
    mps: MPSControl | None
    mps_thread_percentage: int | None
    optimize: bool
    _model_pct: dict[str, int]  # per model (digest): its MPS active thread percentage
    privilege: mig.MigPrivilege
    _probe: Callable[[], mig.MigPrivilege]
    _nvml_refused: str | None  # NVML's own NO_PERMISSION, once seen: the probe was wrong
    _reconfiguring: threading.Lock
    _reconfigurations: Any
    on_units_changed: list[Callable[[], None]]

    # -- MPS ------------------------------------------------------------------------------------
    def worker_env(self, info: UnitInfo, digest: str) -> dict[str, str]:
        """The environment of a model's worker on a unit: its device, its MPS daemon and share, and
        whether it may rewrite the model for inference (`optimize.ENV`)."""
        env = {} if self.optimize else {optimize.ENV: "0"}
        if info.kind == "cpu":
            return env
        if self.mps is None:
            return {**env, "CUDA_VISIBLE_DEVICES": info.id}
        pct = self._model_pct.get(digest, self.mps_thread_percentage)
        return {**env, **self.mps.ensure(info.id).client_env(pct)}

    def set_active_thread_percentage(self, digest: str, pct: int | None) -> None:
        """A model's MPS share of its unit's SMs (None: the default); its next worker gets it."""
        if pct is None:
            self._model_pct.pop(digest, None)
        else:
            self._model_pct[digest] = thread_percentage(pct)

    def start_mps(self) -> None:
        """Start the MPS daemon of every cuda unit now (else each starts with its first worker)."""
        if self.mps is not None:
            for s in list(self.units.values()):
                if s.info.kind != "cpu":
                    self.mps.ensure(s.info.id)

    def _known_env(self, info: UnitInfo, digest: str) -> dict[str, str] | None:
        """`worker_env` without starting anything: None under MPS while the unit's daemon is not
        running (a preparation does not start a daemon; a miss does, as before)."""
        if info.kind == "cpu" or self.mps is None:
            return self.worker_env(info, digest)
        daemon = getattr(self.mps, "daemons", {}).get(info.id)
        if daemon is None or not daemon.running:
            return None
        return daemon.client_env(self._model_pct.get(digest, self.mps_thread_percentage))

    # -- GPU control: geometry ------------------------------------------------------------------
    def mig_privilege(self) -> mig.MigPrivilege:
        """May this manager change MIG geometry now: the OS's answer, asked again each time (a
        capability may be granted while it runs), unless NVML itself has refused it already."""
        if self.nvml is None:
            return self.privilege
        if self._nvml_refused is not None:
            return mig.MigPrivilege(False, self._nvml_refused)
        self.privilege = self._probe()
        return self.privilege

    def reconfigure(self, index: int, profiles: list[str], drain_timeout_s: float = 30.0) -> dict:
        """Slice GPU `index` into `profiles` (MIG profile names): {"gpu", "geometry", "units"} after.

        Refuses before touching anything: an invalid geometry (mig.InvalidGeometry), MIG mode off
        (mig.MigModeOff), no such GPU (mig.UnknownGPU), no privilege to change geometry
        (mig.MigNotPermitted: not root, no mig-config capability). Then drains the GPU's units: no new jobs,
        running ones waited for up to `drain_timeout_s` (else mig.UnitsBusy, and the units serve
        again), workers and MPS daemons stopped; applies the geometry; discovers the GPU's units.
        A destroy NVML refuses as in use with no process visible (mig.InstancesInUse) is undone
        before it is raised; an NVML NO_PERMISSION (mig.MigNotPermitted) is remembered, so the next
        attempt is refused before draining.

        Counted in `faas_gpu_mig_reconfigurations_total`: done when the geometry changed, refused
        when nothing was touched, failed when NVML failed mid-way; a GPU this node does not have is
        not counted (its index would be a label anyone could invent).
        """
        try:
            result, changed = self._reconfigure(index, profiles, drain_timeout_s)
        except mig.MigNotPermitted as exc:
            self._reconfigurations.labels(str(index), "refused").inc()
            # NVML refusing a create or destroy says the probe was wrong; an unreadable process list
            # (another user's processes on an instance) is about that instance, now
            if self._nvml_refused is None and self.privilege.allowed and not isinstance(exc, mig.ProcessesUnseen):
                self._nvml_refused = f"NVML refused: {exc}"
                log.warning("MIG geometry control: no (%s)", self._nvml_refused)
            raise
        except (mig.InvalidGeometry, mig.MigModeOff, mig.UnitsBusy, mig.InstancesInUse):
            self._reconfigurations.labels(str(index), "refused").inc()
            raise
        except mig.MigError:
            self._reconfigurations.labels(str(index), "failed").inc()
            raise
        if changed:
            self._reconfigurations.labels(str(index), "done").inc()
        return result

    def _reconfigure(self, index: int, profiles: list[str], drain_timeout_s: float) -> tuple[dict, bool]:
        """The reconfiguration itself: (the GPU's status after, whether its geometry changed)."""
        if self.nvml is None:
            raise mig.UnknownGPU(f"gpu {index}: this manager has no GPU control (its back end has no GPUs)")
        with self._reconfiguring:
            plan = mig.check_geometry(self.nvml, index, profiles)
            states = [s for s in self.units.values() if s.info.kind != "cpu" and s.info.index == index]
            if not plan.changes:
                return self._gpu_status(index, [i.profile for i in sorted(plan.keep, key=lambda i: i.start)]), False
            privilege = self.mig_privilege()
            if not privilege.allowed:  # before draining: nothing stopped for a change that cannot happen
                raise mig.MigNotPermitted(index, privilege.reason)
            held = self._drain(index, states, drain_timeout_s)
            try:
                for s in states:
                    self._stop_unit(s)
                error: Exception | None = None
                geometry: list[str] = []
                try:
                    geometry = mig.apply_geometry(
                        self.nvml, index, profiles, busy=lambda: [s.info.id for s in states if s.busy_since is not None]
                    )
                except mig.MigError as exc:  # the GPU may be half-way: what exists now is what we serve
                    error = exc
                try:
                    found = [u for u in discover_units(self.nvml) if u.index == index and u.kind != "cpu"]
                except Exception as exc:  # NVML gone mid-way: keep the old units, drained no more
                    for s in states:
                        s.draining = False
                    raise mig.MigError(f"gpu {index}: rediscovering its units failed: {exc}") from exc
                self._replace_units(states, found)
                if error is not None:
                    raise error
            finally:
                for s in held:
                    s.lock.release()
                self._changed()
            log.info("gpu %d: geometry %s, units %s", index, geometry, [u.id for u in found])
            return self._gpu_status(index, geometry), True

    def _gpu_status(self, index: int, geometry: list[str]) -> dict:
        ids = {s.info.id for s in self.units.values() if s.info.kind != "cpu" and s.info.index == index}
        return {"gpu": index, "geometry": geometry, "units": [u for u in self.status() if u["unit"] in ids]}

    def _drain(self, index: int, states: list[_UnitState], timeout_s: float) -> list[_UnitState]:
        """No new jobs on these units; hold each one's lock once its running job ended."""
        for s in states:
            s.draining = True
        self._changed()  # out of the datastore: the scheduler stops placing on them
        deadline = time.monotonic() + max(0.0, timeout_s)
        held: list[_UnitState] = []
        for s in states:
            if s.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                held.append(s)
                continue
            busy = [x.info.id for x in states if x.busy_since is not None] or [s.info.id]
            for h in held:
                h.lock.release()
            for x in states:
                x.draining = False
            self._changed()
            raise mig.UnitsBusy(index, busy)
        return held

    def _stop_unit(self, state: _UnitState) -> None:
        # list(): jobs elsewhere add workers
        for key in [k for k in list(self.executor.workers) if k[1] == state.info.id]:
            self._drop(key, state)
        # what the executor keeps ahead for the unit: its environment names a device (or daemon) that may not
        # exist after (under MPS the daemon's environment: its idle workers end with it)
        self.executor.stop_unit(state.info.id, self.worker_env(state.info, "") if self.mps is None else None)
        if self.mps is not None:
            self.mps.stop(state.info.id)

    def _replace_units(self, old: list[_UnitState], found: list[UnitInfo]) -> None:
        """The GPU's units as NVML now has them: a kept unit serves again, a gone one is retired."""
        by_id = {u.id: u for u in found}
        units = dict(self.units)  # a new dict: readers iterating the old one are not disturbed
        for s in old:
            if by_id.get(s.info.id) == s.info:
                s.draining = False
                continue
            s.retired = True
            units.pop(s.info.id, None)
        for u in found:
            if u.id not in units:
                units[u.id] = self._state(u)
        self.units = units

    def _changed(self) -> None:
        for listener in self.on_units_changed:
            try:
                listener()
            except Exception as exc:  # a datastore hiccup must not fail the reconfiguration
                log.warning("units-changed listener failed: %s", exc)
