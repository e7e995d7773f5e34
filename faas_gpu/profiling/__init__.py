"""INFless's combined operator profiling (§3.3): operator profiles, model graphs, the latency predictor.

torch is imported only where a model is traced or timed: the predictor and the store work without it.
"""

from .graph import OpGraph, OpNode, TraceError
from .predictor import INFEASIBLE_MS, Estimate, LatencyPredictor, MissingProfile, load_infless_profiles
from .report import ErrorReport, ReportRow, error_report
from .store import ProfileStore, profiles_db

__all__ = [
    "INFEASIBLE_MS",
    "ErrorReport",
    "Estimate",
    "LatencyPredictor",
    "MissingProfile",
    "OpGraph",
    "OpNode",
    "ProfileStore",
    "ReportRow",
    "TraceError",
    "error_report",
    "load_infless_profiles",
    "profiles_db",
]
