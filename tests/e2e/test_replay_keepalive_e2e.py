"""`faas-gpu replay --policies lsth,hhp` end to end (issue 45): a tiny trace on a real stack whose
provider's keep-alive clock is compressed with the trace, each function deployed once per keep-alive
policy and taken to zero when idle, against the simulator's Fig. 16 replay of the same minutes.
Every request is answered: one that starts its function from zero waits for the replica (before the
fix the keep-alive took it away under the request, 503)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from faas_gpu.paths import REPO_ROOT
from faas_gpu.sim.replay import KEEPALIVE_FIGURES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a stack, 4 builds: past 300 s under load


def test_keepalive_replay_runs_both_policies_live_and_simulated(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(["1", "1", "0", "0", "0", "0", "2", "0", "0", "0", "1", "0"]) + "\n")
    b.write_text("\n".join(["0", "1", "0", "0", "0", "0", "0", "0", "0", "1", "0", "0"]) + "\n")
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable, "-m", "faas_gpu.cli", "replay", str(a), str(b), "--policies", "lsth,hhp",
            "--keepalive-minutes", "12", "--keepalive-compress", "30", "--out", str(out),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "FAAS_GPU_HOME": str(tmp_path / "unused-home")},
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert {f"sim_over_live_{p}_{f}" for p in ("lsth", "hhp") for f in KEEPALIVE_FIGURES} <= set(result)
    assert result["keepalive_requests"] == 7 and isinstance(result["same_policy_order"], bool)
    assert result["live_lsth_answered"] == result["live_hhp_answered"] == 7  # nothing lost to a scale to zero
    assert result["sim_hhp_cold_starts"] == 2  # HHP's default keeps each function warm after its first minute
    assert any(line.startswith("lsth       cold_starts") for line in lines)
    rows = list(csv.DictReader((out / "outcomes.csv").open()))
    assert {row["policy"] for row in rows} == {"lsth", "hhp"}
    assert all(row["process"] and row["cold"] in ("0", "1") for row in rows)
