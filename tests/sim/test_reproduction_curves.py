"""The reproductions report curves: `reproduce_gpu_faas.py --quick` end to end, its JSON and PNGs."""

from __future__ import annotations

import json

import pytest

from faas_gpu.paths import REPO_ROOT
from tests.module_files import load as load_file

pytestmark = pytest.mark.slow


def load(name: str):
    return load_file(name, REPO_ROOT / "benchmarks" / f"{name}.py")


def test_gpu_faas_curves_along_load_and_working_set(tmp_path, capsys):
    bench = load("reproduce_gpu_faas")
    assert bench.main(["--quick", "--seeds", "1", "--figures", str(tmp_path)]) == 0
    fig = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert "lalb_ws35_latency_reduction_pct" in fig  # the single points are kept
    loads, sets = fig["curve_load_rpm"], fig["curve_ws_working_sets"]
    assert 325 in loads and min(loads) <= 50 and max(loads) >= 400 and max(sets) == 100
    for pol in ("lb", "lalb", "lalb_o3"):
        for metric in ("avg_latency_s", "p99_latency_s", "miss_ratio"):
            assert len(fig[f"curve_load_ws35_{pol}_{metric}"]) == len(loads)
            assert len(fig[f"curve_ws_{pol}_{metric}"]) == len(sets)
    # LB queues at the paper's load, not at 50/min: the cut LALB makes is larger there
    cut = fig["curve_load_ws15_lalb_latency_reduction_pct"]
    assert cut[loads.index(325)] > cut[loads.index(50)] + 20
    for name in ("gpu_faas_load.png", "gpu_faas_working_set.png"):
        png = tmp_path / name
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 200_000
