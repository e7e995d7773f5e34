"""Issue 45's findings on traces the simulator's developers never saw (D1-D7, D9's `--trace` and
`--infer-time`): each bad input is one line naming the file, the line and the field; each thing
assumed is printed; the span and what is drawn have guard rails."""

from __future__ import annotations

import json

import matplotlib.axes
import numpy as np
import pytest

from faas_gpu.sim.cli import main
from faas_gpu.sim.engine import RunResult
from faas_gpu.sim.report import write_timeline

HEADER = ["HashOwner", "HashApp", "HashFunction", "Trigger"]


def azure2019(path, rows, extra_columns=(), bom=False):
    """rows: per function, its per-minute counts (function fN of app aN)."""
    minutes = len(rows[0])
    head = ",".join(HEADER + [str(m) for m in range(1, minutes + 1)] + list(extra_columns))
    lines = [head] + [
        ",".join(["o", f"a{i}", f"f{i}", "http"] + [str(c) for c in counts] + ["x"] * len(extra_columns))
        for i, counts in enumerate(rows)
    ]
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def azure2021(path, rows, header="app,func,end_timestamp,duration"):
    path.write_text(header + "\n" + "".join(",".join(str(c) for c in r) + "\n" for r in rows))
    return path


def run(capsys, *argv):
    rc = main([*map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_d1_a_working_set_holds_only_functions_that_are_called_and_says_how_many(tmp_path, capsys):
    """ws35 on a sparse trace of 4 functions: the windows with no invocation are no members, the
    summary counts the members, and the notes say 35 were asked for."""
    rows = [[0] * 600 for _ in range(4)]
    rows[0][3] = rows[0][400] = 2
    rows[1][200] = 1
    rows[2][5] = 4
    trace = azure2019(tmp_path / "sparse.csv", rows)
    rc, lines, err = run(
        capsys, "--trace", trace, "--minutes", 10, "--working-set", 35, "--reuse-functions", "--policies", "lb",
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert rc == 0, err
    members = lines[0]["working_set"]
    assert members < 35 and lines[0]["requests"] > 0
    assert f"working set {members}, not 35" in err
    assert "35 of its 4 functions" not in err and f"a working set of {members} windows of its 4 functions" in err
    sent = (tmp_path / "o" / "requests_per_minute.csv").read_text().splitlines()[1:]
    per_model: dict[str, int] = {}
    for row in sent:
        model, requests = row.split(",")[1], int(row.split(",")[-1])
        per_model[model] = per_model.get(model, 0) + requests
    assert len(per_model) == members and all(n > 0 for n in per_model.values())  # every member is called


def test_d2_a_2021_row_with_a_missing_field_is_one_line_naming_file_line_and_field(tmp_path, capsys):
    trace = tmp_path / "inv2021.csv"
    trace.write_text("app,func,end_timestamp,duration\nA,x,10,0.5\nA,x,20\n")
    rc, _, err = run(capsys, "--trace", trace, "--out", tmp_path / "o")
    assert rc == 2
    assert one_line_error(err) == (
        "faas-gpu sim: --trace: inv2021.csv line 3: duration: missing (the row is shorter than the header)"
    )


def test_d2_a_2019_row_with_an_empty_minute_names_the_minute(tmp_path, capsys):
    trace = tmp_path / "inv2019.csv"
    trace.write_text(",".join(HEADER) + ",1,2,3\no,a,f,http,1,,2\n")
    rc, _, err = run(capsys, "--trace", trace, "--out", tmp_path / "o")
    assert rc == 2 and one_line_error(err).endswith(
        "inv2019.csv line 2: minute 2: missing (the row is shorter than the header)"
    )


def test_d3_a_scale_that_rounds_every_count_to_zero_is_an_error_naming_scale(tmp_path, capsys):
    trace = azure2019(tmp_path / "t.csv", [[1, 0, 0, 2], [0, 3, 0, 0]])
    rc, _, err = run(capsys, "--trace", trace, "--scale", 0.01, "--out", tmp_path / "o")
    assert rc == 2
    line = one_line_error(err)
    assert line.startswith("faas-gpu sim: --scale: 0.01 rounds every count to 0") and "6 invocations" in line


def test_d3_a_function_whose_counts_all_round_to_zero_leaves_the_working_set_said(tmp_path, capsys):
    trace = azure2019(tmp_path / "t.csv", [[100, 0, 0, 200], [0, 1, 0, 0]])
    rc, lines, err = run(capsys, "--trace", trace, "--scale", 0.1, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0, err
    assert lines[0]["working_set"] == 1 and lines[0]["requests"] == 30
    assert "at scale 0.1 1 function(s) round to no request and leave the working set (f1-http)" in err


def test_d4_a_stray_2021_timestamp_is_refused_naming_its_line_and_the_limit(tmp_path, capsys):
    trace = azure2021(tmp_path / "stray.csv", [("A", "x", 10, 0.5), ("A", "x", 6e7, 0.5), ("B", "y", 70, 1)])
    rc, _, err = run(capsys, "--trace", trace, "--out", tmp_path / "o")
    assert rc == 2
    line = one_line_error(err)
    assert line.startswith("faas-gpu sim: --trace: stray.csv line 3: end_timestamp: an arrival at second 6e+07")
    assert "1,000,000 minutes" in line and "over the limit of 43,200" in line and "--max-span-minutes" in line


def test_d4_the_minutes_asked_for_are_read_around_a_stray_timestamp_with_the_span_printed(tmp_path, capsys):
    trace = azure2021(tmp_path / "stray.csv", [("A", "x", 10, 0.5), ("A", "x", 6e7, 0.5), ("B", "y", 70, 1)])
    rc, lines, err = run(capsys, "--trace", trace, "--minutes", 2, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0, err
    assert lines[0]["requests"] == 2
    assert "2 invocations of 2 function(s), arrivals from second 9.5 to 69: 2 minutes" in err
    assert "1 invocation(s) at or after minute 2 not read" in err


def test_d4_a_span_over_the_limit_once_raised_is_read_with_a_warning(tmp_path, capsys):
    rows = [("A", "x", 10 + 20 * i, 0.5) for i in range(5)] + [("A", "x", 5 * 86400.0, 0.5)]
    trace = azure2021(tmp_path / "late.csv", rows)
    rc, _, err = run(
        capsys, "--trace", trace, "--max-span-minutes", 10_000, "--policies", "lb", "--out", tmp_path / "o"
    )
    assert rc == 0, err
    assert "warning: late.csv line 7: the latest invocation (second 432000) comes 7,198 minutes after any other" in err


def test_d4_a_million_minute_run_is_drawn_in_at_most_max_bins_steps(tmp_path, monkeypatch):
    """The timeline of a run whose last job ends at 6e7 s: per-minute bins would be a million."""
    from faas_gpu.sim.report import MAX_BINS

    points: list[int] = []
    step = matplotlib.axes.Axes.step

    def counted(self, x, *args, **kwargs):
        points.append(len(x))
        return step(self, x, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "step", counted)
    times = np.array([0.0, 30.0, 6e7 - 10.0])
    memory = [(0.0, 0.0)] + [(float(t), float(i % 3)) for i, t in enumerate(np.linspace(0, 6e7, 50_000))]
    r = RunResult(
        "lb", 0, 1, np.array([1.0, 1.0, 1.0]), 1, 2, 0, 3.0, 6e7, 1, 1.0, [0, 1, 2], {0: []},
        dispatch_times=times, dispatch_hits=np.array([False, True, False]), memory_steps=memory,
        memory_capacity_mb=10.0,
    )  # fmt: skip
    write_timeline([r], tmp_path / "timeline.png", None)
    assert points and max(points) <= 2 * MAX_BINS + 1


def test_d5_a_negative_o3_limit_is_a_flag_error_not_a_traceback(tmp_path, capsys):
    trace = azure2019(tmp_path / "t.csv", [[1, 2]])
    with pytest.raises(SystemExit) as exit_:
        main(["--trace", str(trace), "--o3-limit", "-5", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "argument --o3-limit: must be >= 0, got -5" in err


def test_d6_a_csv_starting_with_a_utf8_bom_is_read(tmp_path, capsys):
    trace = azure2019(tmp_path / "bom.csv", [[1, 2, 0], [0, 0, 3]], bom=True)
    rc, lines, err = run(capsys, "--trace", trace, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0, err
    assert lines[0]["requests"] == 6 and "bom.csv (azure2019)" in err
    bom2021 = tmp_path / "bom2021.csv"
    bom2021.write_text("\ufeffapp,func,end_timestamp,duration\nA,x,10,0.5\n", encoding="utf-8")
    rc, lines, err = run(capsys, "--trace", bom2021, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0 and lines[0]["requests"] == 1, err


def test_d7_fractional_counts_are_rounded_and_said(tmp_path, capsys):
    trace = azure2019(tmp_path / "frac.csv", [[0.4, 0.4, 0.4], [2, 0, 1]])
    rc, lines, err = run(capsys, "--trace", trace, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0, err
    assert lines[0]["requests"] == 1 + 3  # 1.2 rounds to 1 on the running sum
    assert "3 function-minute(s) have fractional counts (the first: 0.4 for f0-http at trace minute 0)" in err


def test_d7_extra_columns_are_said_in_both_formats(tmp_path, capsys):
    trace = azure2019(tmp_path / "extra.csv", [[1, 2]], extra_columns=("Notes", "Region"))
    rc, lines, err = run(capsys, "--trace", trace, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0 and lines[0]["requests"] == 3, err
    assert "extra.csv: 2 column(s) after minute 2 ignored ('Notes', 'Region')" in err
    extra2021 = azure2021(
        tmp_path / "extra2021.csv", [("A", "x", 10, 0.5, "eu")], "app,func,end_timestamp,duration,region"
    )
    rc, lines, err = run(capsys, "--trace", extra2021, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0 and lines[0]["requests"] == 1, err
    assert "extra2021.csv: column(s) 'region' ignored (read: app,func,end_timestamp,duration)" in err


def test_d9_per_minute_txt_traces_are_taken_by_trace(tmp_path, capsys):
    a, b = tmp_path / "1.txt", tmp_path / "2.txt"
    a.write_text("1\n0\n3\n")
    b.write_text("0\n2\n2\n")
    rc, lines, err = run(capsys, "--trace", a, "--trace", b, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0, err
    assert lines[0]["requests"] == 8 and lines[0]["working_set"] == 2
    assert "1.txt, 2.txt (per-minute), minutes 0..3" in err


def test_d9_the_2021_gpu_time_can_be_the_model_catalogues(tmp_path, capsys):
    """A 2021 function ran 200 s: by default that is its inference time; --infer-time catalog
    keeps the model's from --models."""
    trace = azure2021(tmp_path / "long.csv", [("A", "x", 230.0, 200.0), ("A", "x", 250.0, 200.0)])
    models = tmp_path / "models.yaml"
    models.write_text("- {name: m, size_mb: 100, load_s: 1.0, infer_s: 0.5}\n")
    common = ("--trace", trace, "--models", models, "--cluster", "1x1:1GB", "--policies", "lb", "--out", tmp_path / "o")
    rc, lines, err = run(capsys, *common)
    assert rc == 0 and lines[0]["avg_latency_s"] > 200, err
    rc, lines, err = run(capsys, *common, "--infer-time", "catalog")
    assert rc == 0, err
    assert lines[0]["avg_latency_s"] < 2.0 and "inference time = the recorded" not in err
