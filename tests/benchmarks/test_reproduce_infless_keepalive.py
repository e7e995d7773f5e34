"""benchmarks/reproduce_infless.py's keep-alive part (Fig. 16) on traces of one's own (issue 45, D9):
any trace the simulator reads, each function a trace, both averaging ways, the paper beside."""

from __future__ import annotations

import json

import pytest

from faas_gpu.paths import REPO_ROOT
from tests.module_files import registered


@pytest.fixture(scope="module")
def bench():
    with registered("reproduce_infless", REPO_ROOT / "benchmarks" / "reproduce_infless.py") as module:
        yield module


def figures(capsys) -> tuple[dict, str]:
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1]), out


def test_keepalive_replays_any_trace_with_both_averages_and_the_papers_figures(bench, tmp_path, capsys):
    """A sparse per-minute trace (two invocations 5 h apart) and a busy 2021 function: the mean of
    the per-trace rates and the pooled rate differ, and both are printed with the paper's -21.9% /
    -24.3%."""
    sparse = tmp_path / "sparse.txt"
    sparse.write_text("\n".join(["1"] + ["0"] * 299 + ["1"]) + "\n")  # minutes 0 and 300: 5 h apart
    busy = tmp_path / "busy2021.csv"
    busy.write_text(
        "app,func,end_timestamp,duration\n"
        + "".join(f"A,x,{m * 60 + i * 0.05 + 1},0.01\n" for m in range(5) for i in range(200))
    )
    rc = bench.main(["--keepalive-only", "--keepalive-trace", str(sparse), "--keepalive-trace", str(busy)])
    fig, out = figures(capsys)
    assert rc == 0
    assert fig["keepalive_traces"] == 2
    # HHP (4 h, too few idle times: its default keeps 4 h): the sparse trace's minute 300 is cold
    # (2 of 2), the busy one only its first minute (1 of 1000)
    assert fig["hhp_cold_start_pct"] == pytest.approx((100 * 2 / 2 + 100 * 1 / 1000) / 2, abs=1e-3)
    assert fig["hhp_cold_start_pooled_pct"] == pytest.approx(100 * 3 / 1002, abs=1e-3)
    assert fig["hhp_cold_per_active_minute_pooled_pct"] == pytest.approx(100 * 3 / 7, abs=1e-3)
    assert (fig["paper_lsth_vs_hhp_cold_change_pct"], fig["paper_lsth_vs_hhp_waste_change_pct"]) == (-21.9, -24.3)
    assert "lsth_g05_vs_hhp_cold_change_pooled_pct" in fig and "lsth_g05_vs_hhp_cold_change_pct" in fig
    assert "a burst of 10^6 in one minute is one cold start" in out
    assert "2 function(s) of sparse.txt, busy2021.csv" in out


def test_a_bad_keepalive_trace_is_one_line_naming_its_file_line_and_field(bench, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("app,func,end_timestamp,duration\nA,x,ten,0.5\n")
    assert bench.main(["--keepalive-only", "--keepalive-trace", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "reproduce_infless: trace.file: bad.csv line 2: end_timestamp: expected a number, got 'ten'"
