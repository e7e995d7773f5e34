"""Placement leases (`faas_gpu.contract.lease`): which unit, if any, a function's batches may go
to directly for the next `LEASE_S`, without the scheduler placing each one.

A lease stands for placement decisions the scheduler would make anyway, so it is granted only
when placing the batches here would decide nothing else:
- the batches are strict (a best-effort batch waits behind strict work: PROTEAN's class queue
  orders it, so it always comes through the queue), and PROTEAN's Job Distribution is off (its
  choice of MIG slice is per batch);
- nothing waits in the scheduler's queues: a leased batch overtakes no job admitted before it;
- a unit holds the model already (LALB's cache locality: a lease never loads a model, the first
  batch of a model goes through the queue and its placement loads it), and takes work now (not
  held for a reconfiguration, not resting after a refusal). Among the holders an idle one, then
  the least dispatched (LALB's order among idle units).
The GPU Manager runs one job at a time per unit, leased or placed, so neither kind is lost or
runs beside the other; a unit that starts draining answers so, and the instance falls back.
"""

from __future__ import annotations

from .admission import Admission
from .units import UnitRef, UnitView


def lease_unit(
    view: UnitView, admission: Admission, digest: str, best_effort: bool, distribution: bool
) -> UnitRef | None:
    """The unit to lease for `digest`'s batches now, or None (send them through the queue).
    Called under the scheduler's lock."""
    policy = view.policy
    if best_effort or distribution or policy is None or not view.units:
        return None
    if len(admission.queue) or policy.queued():
        return None
    unavailable = view.unavailable()
    holders = [
        policy.units[i]
        for i in policy.holders.get(digest, ())
        if i < len(view.units) and view.units[i].key not in unavailable
    ]
    if not holders:
        return None
    best = min(holders, key=lambda u: (not u.idle, u.dispatches, u.id))
    return view.units[best.id]
