"""Pure policies: they take a snapshot (or driver events) and the time, and return decisions.

No module here reads the clock, sleeps, or does I/O; the daemons and the simulator drive the
same objects. `tests/policies/test_policy_purity.py` keeps it so.
"""

from .lalb import (
    Dispatch,
    LALBScheduler,
    LBScheduler,
    LookAhead,
    Model,
    PlacementError,
    Request,
    Unit,
    make_scheduler,
)
from .model_cache import ModelCache, ModelTooLarge

__all__ = [
    "Dispatch",
    "LALBScheduler",
    "LBScheduler",
    "LookAhead",
    "Model",
    "ModelCache",
    "ModelTooLarge",
    "PlacementError",
    "Request",
    "Unit",
    "make_scheduler",
]
