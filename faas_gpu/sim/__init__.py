"""Trace-driven simulator: the real policy objects on a virtual clock."""

from .engine import RunResult, simulate
from .scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = ["RunResult", "Scenario", "ScenarioError", "load_scenario", "parse_scenario", "simulate"]
