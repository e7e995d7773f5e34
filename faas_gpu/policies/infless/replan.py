"""When a re-plan may restart instances, which batches the arrivals can fill, and how corrections
fade: the stability rules around INFless's re-planning (issue 20, run 7 of the path-limit section).

A plan that changes an instance's batch size or threads restarts it: on a small node the new
process's start takes the cores the serving one uses, and a new batch shape is slow on its first
calls. Run 7 walked one instance from batch 8 to batch 32 under 32 closed-loop callers for a
predicted gain of a few percent, then judged the restarted plan short and corrected the model to
its cap while throughput collapsed. So:

- `restart_pays`: a restarting re-plan only when the running plan is clearly short (its capacity,
  observed at saturation or else predicted, at most (1 - SHORT_MARGIN) of the demand) and the new
  plan's prediction, scaled by the running plan's own accuracy (observed / predicted, at most 1),
  beats the running plan's capacity by MIN_GAIN. A prediction that was 20% optimistic for the
  running plan is taken as 20% optimistic for the next one: a new plan must win on the measured
  footing, not on the model's. The provider adds a minimum gap between restarts
  (MIN_RESTART_GAP_S).
- `fills`: a batch of b fills within its timeout only if the arrivals bring b requests in that
  time: rate >= r_low (Eq. 1 with the timeout's slack). Algorithm 1 checks r_low against the
  demand it plans for, which for a saturated closed loop is a headroom over the plan
  (`demand`), not what arrives: 210 rps filled ~23 requests into batch 32's ~112 ms timeout
  (run 7's replies: mean batch 20). The provider plans no batch that the measured arrival rate
  does not fill.
- `underfilled`: the other way round, arrivals under the plan's lower bound (INFless's R < R_min)
  leave every batch by its timeout, part full, so each call waits out a timeout near the SLO.
  The dispatcher releases such instances, but not those com.openfaas.scale.min keeps, and a plan
  that is short of nothing never pays for a restart: run 28 left one batch-4 instance (timeout
  236 ms) to a single caller, 4 rps at p50 246 ms. The provider plans again for what arrives.
- `decayed`: a correction moves back toward 1 by DECAY a judged window while the observed
  capacity meets the demand (nothing queues, what arrives is answered), so a correction made
  in a bad moment does not outlive it.
"""

from __future__ import annotations

from collections.abc import Iterable

from .capacity import Candidate, bounds

SHORT_MARGIN = 0.2  # the running plan is short when its capacity is at most (1 - this) of the demand
MIN_GAIN = 0.25  # a restarting re-plan must promise this much more than the running plan serves
MIN_RESTART_GAP_S = 30.0  # the least time between two re-plans that restart instances
DECAY = 0.5  # the share of a correction's excess over 1 kept per window in which demand is met


def restart_pays(
    running_predicted: float,
    running_observed: float | None,
    new_predicted: float,
    demand_rps: float,
    *,
    short_margin: float = SHORT_MARGIN,
    min_gain: float = MIN_GAIN,
) -> bool:
    """Whether a plan predicted to serve `new_predicted` should replace (restart) a running plan
    predicted to serve `running_predicted` and observed to serve `running_observed` (None: not
    observed at saturation; its prediction stands for it) under `demand_rps`."""
    if running_predicted <= 0:
        return True  # nothing serves: no capacity to lose
    capacity = running_predicted if running_observed is None else running_observed
    if capacity > (1.0 - short_margin) * demand_rps:
        return False
    accuracy = min(1.0, capacity / running_predicted)
    return new_predicted * accuracy > (1.0 + min_gain) * capacity


def fills(c: Candidate, t_slo_s: float, arrival_rps: float) -> bool:
    """Whether `arrival_rps` fills a batch of `c` within its timeout (r_low of Eq. 1; batch 1: always)."""
    if c.batch == 1:
        return True
    if c.t_exec_s <= 0 or c.t_exec_s > t_slo_s:
        return False
    return bounds(c.t_exec_s, t_slo_s, c.batch, c.path_s).r_low <= arrival_rps + 1e-9


def underfilled(arrival_rps: float, r_lows: Iterable[float]) -> bool:
    """Whether `arrival_rps` (measured, > 0: an idle plan is keep-alive's to judge) is under the
    plan's lower bound, the sum of its instances' r_low (batch 1's is 0)."""
    return arrival_rps > 0 and arrival_rps < sum(r_lows) - 1e-9


def decayed(factor: float, *, decay: float = DECAY) -> float:
    """A correction factor one step back toward 1 (1 once within 1% of it)."""
    f = 1.0 + (max(1.0, factor) - 1.0) * decay
    return 1.0 if f < 1.01 else f
