"""HarmonyBatch's input files, read and handed to the pure planner (`faas_gpu.policies.harmony`).

Both files are in the reference implementation's format (shared data, `harmonybatch/`): `model.json`
holds each model's latency coefficients, `config.json` the platform's search ranges.
"""

from __future__ import annotations

import json
from pathlib import Path

from faas_gpu.policies.harmony.models import ModelCoefficients
from faas_gpu.policies.harmony.platform import Platform


def load_models(path: str | Path) -> dict[str, ModelCoefficients]:
    """Every model of a `model.json` in the reference's format, by name."""
    data = json.loads(Path(path).read_text())
    return {name: ModelCoefficients.from_json(name, entry) for name, entry in data.items()}


def load_model(path: str | Path, name: str) -> ModelCoefficients:
    """One model of a `model.json`; KeyError naming the models there when it is not one of them."""
    models = load_models(path)
    if name not in models:
        raise KeyError(f"{name!r} not in {path} (models: {', '.join(sorted(models))})")
    return models[name]


def load_platform(path: str | Path) -> Platform:
    """Search ranges from a `config.json` in the reference's format."""
    return Platform.from_config(json.loads(Path(path).read_text()))
