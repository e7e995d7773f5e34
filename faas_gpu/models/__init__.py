"""Model artifacts: the content-addressed store and the checks that keep loading them free of code.

Core, not a daemon's: the scheduler stores every upload (to send it to a node that lacks it), the
GPU Managers store and load them, and the instance's GPU client checks an artifact with the same
rules before it sends one (`safe_formats.detect_format`).
"""

from faas_gpu.contract.errors import ArtifactError, ArtifactTooLarge

from .store import FORMATS, Artifact, ModelStore, detect_format

__all__ = ["FORMATS", "Artifact", "ArtifactError", "ArtifactTooLarge", "ModelStore", "detect_format"]
