"""`faas-gpu replay` end to end (issue 45), through `benchmarks/sim_vs_live.py --quick`: a tiny
trace sent to a real `faas-gpu up` on the cpu back end (its functions real torch.export models
saved with faas_gpu.save_model) and through the simulator, side by side: the table, the outcomes
of both sides, and the one JSON line. About 45 s here (the stack's start is most of it)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

from faas_gpu.paths import REPO_ROOT
from faas_gpu.sim.replay import FIGURES


def test_replay_runs_both_sides_and_prints_the_table_and_the_json(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("3\n2\n")
    b.write_text("1\n2\n")
    out = tmp_path / "out"
    env = {**os.environ, "FAAS_GPU_HOME": str(tmp_path / "unused-home")}
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/sim_vs_live.py",
            "--quick",
            "--trace",
            str(a),
            "--trace",
            str(b),
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["requests"] == 8 and result["functions"] == 2
    assert {f"sim_over_live_lalb_{f}" for f in FIGURES} <= set(result)
    assert isinstance(result["same_policy_order"], bool) and result["policy_order_live"] == ["lalb"]
    assert result["live_lalb_answered"] == 8 and result["sim_lalb_answered"] == 8
    assert result["live_lalb_hits"] + result["live_lalb_cold_starts"] == 8
    assert result["cpus"] == os.cpu_count() and "load_avg_start" in result and result["wall_s"] > 0
    assert any(line.startswith("lalb       mean_latency (s)") for line in lines)  # the table, side by side
    assert "minutes 0..2 of a.txt, b.txt (per-minute), 8 requests of 2 functions compressed x12" in r.stderr
    rows = list(csv.DictReader((out / "outcomes.csv").open()))
    assert {(row["side"], row["policy"]) for row in rows} == {("live", "lalb"), ("sim", "lalb")}
    live = [row for row in rows if row["side"] == "live"]
    assert all(row["cache"] in ("hit", "miss") and float(row["exec_s"]) > 0 for row in live)  # the job's own timings
    runs = json.loads((out / "runs.json").read_text())
    assert runs[0]["policy"] == "lalb" and runs[0]["units"] == 1 and runs[0]["unit_memory_mb"] == 16.0
    assert not (tmp_path / "unused-home").exists()  # each policy's stack lives in a folder of its own, then goes
