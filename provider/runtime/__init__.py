"""Runtimes run a function's replicas. `local` (processes) is the embedded default."""

from .base import InstanceSpec, LaunchError, Runtime

__all__ = ["InstanceSpec", "LaunchError", "Runtime"]
