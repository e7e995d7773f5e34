"""Runtimes run a function's replicas. `local` (processes) is the embedded default."""

from .base import LaunchError, Runtime

__all__ = ["LaunchError", "Runtime"]
