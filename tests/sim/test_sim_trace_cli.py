"""`faas-gpu sim --trace`: a user's own Azure-format trace in, per-policy figures and a report out."""

from __future__ import annotations

import csv
import json
from collections import Counter

import numpy as np
import pytest

from faas_gpu.sim import load_scenario, simulate
from faas_gpu.sim.cli import main
from faas_gpu.sim.curves import Mark, Panel, Series, plot_panels
from faas_gpu.sim.scenario import parse_cluster
from tests.sim.test_sim import SCENARIO

PNG = b"\x89PNG\r\n\x1a\n"
HEADER = ["HashOwner", "HashApp", "HashFunction", "Trigger"]


def azure2019(tmp_path, rows, name="invocations_per_function_md.anon.d01.csv"):
    """rows: per function, its per-minute counts (function fN of app aN)."""
    lines = [",".join(HEADER + [str(m) for m in range(1, len(rows[0]) + 1)])]
    lines += [",".join(["o", f"a{i}", f"f{i}", "http"] + [str(c) for c in counts]) for i, counts in enumerate(rows)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def run(capsys, *argv):
    rc = main([*map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def test_an_azure_2019_trace_is_replayed_against_every_policy_with_a_report(tmp_path, capsys):
    rows = [[4, 0, 6, 2, 0], [1, 1, 0, 0, 3], [0, 0, 0, 0, 0], [0, 2, 0, 0, 0]]
    trace = azure2019(tmp_path, rows)
    durations = tmp_path / "function_durations_percentiles.anon.d01.csv"
    durations.write_text("HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum\no,a0,f0,300,10,100,900\n")
    out = tmp_path / "report"
    rc, lines, err = run(capsys, "--trace", trace, "--durations", durations, "--cluster", "1x2:8GB", "--out", out)
    assert rc == 0, err
    # every policy by default; every request the trace records, the idle function left out
    assert [r["policy"] for r in lines] == ["lb", "lalb", "lalb_o3"]
    assert all(r["requests"] == sum(map(sum, rows)) and r["working_set"] == 3 for r in lines)
    assert "minutes 0..5, 3 of its 4 functions (3 invoked" in err and "1 node(s) x 2 GPU(s) x 8192 MB" in err
    assert "lalb_o3(limit 25)" in err  # the readable table beside the JSON lines
    for name in ("latency_cdf.png", "timeline.png", "policies.png"):
        assert (out / name).read_bytes()[:8] == PNG
    page = (out / "report.html").read_text()
    assert all(p in page for p in ("lb", "lalb", "lalb_o3(limit 25)", "latency_cdf.png", "timeline.png"))
    assert "invocations_per_function_md" in page  # the notes say how the trace was replayed


def test_an_azure_2021_trace_and_a_window_of_it(tmp_path, capsys):
    trace = tmp_path / "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt"
    rows = [("A", "x", 10.5, 0.5), ("A", "x", 70.25, 0.25), ("B", "y", 75.0, 1.0), ("A", "x", 130.0, 0.1)]
    trace.write_text("app,func,end_timestamp,duration\n" + "".join(f"{a},{f},{e},{d}\n" for a, f, e, d in rows))
    rc, lines, err = run(
        capsys, "--trace", trace, "--start-minute", 1, "--minutes", 1, "--policies", "lalb", "--out", tmp_path / "o"
    )
    assert rc == 0, err
    assert [(r["policy"], r["requests"]) for r in lines] == [("lalb", 2)]  # the two invocations of minute 1
    assert "(azure2021), minutes 1..2" in err


def read_sent(path):
    """requests_per_minute.csv as {(function, trace minute): (recorded, requests)}."""
    rows = list(csv.DictReader(path.open()))
    return {(r["function"], int(r["trace_minute"])): (float(r["recorded"]), int(r["requests"])) for r in rows}


def test_the_report_counts_each_functions_requests_per_minute_as_the_trace_records(tmp_path, capsys):
    """How issue 18 is checked, from the command line: a burst, idle minutes, an idle function and
    two functions of one hash under other apps; the requests sent per function and minute
    (counted from the arrivals) are the trace's, at scale 1 and at an explicit scale."""
    rows = [[5, 5, 0, 0, 500, 5], [0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]]
    lines = [",".join(HEADER + [str(m) for m in range(1, 7)])]
    for i, (app, func) in enumerate((("a0", "f0"), ("a1", "f1"), ("a2", "f2"), ("a3", "f0"))):  # f0 twice
        lines.append(",".join(["o", app, func, "http"] + [str(c) for c in rows[i]]))
    trace = tmp_path / "invocations_per_function_md.anon.d01.csv"
    trace.write_text("\n".join(lines) + "\n")
    rc, out, err = run(capsys, "--trace", trace, "--start-minute", 1, "--policies", "lb", "--out", tmp_path / "o")
    assert rc == 0, err
    sent = read_sent(tmp_path / "o" / "requests_per_minute.csv")
    names = {name for name, _ in sent}
    assert names == {"f0-http", "f0-http~2", "f2-http"}  # the idle function left out, the twin named apart
    expected = {"f0-http": rows[0], "f0-http~2": rows[3], "f2-http": rows[2]}
    for (name, minute), (recorded, requests) in sent.items():
        assert recorded == requests == expected[name][minute], (name, minute)
    assert sorted(m for _, m in sent) == sorted(list(range(1, 6)) * 3)
    assert out[0]["requests"] == sum(sum(r[1:]) for r in rows)
    rc, out, err = run(capsys, "--trace", trace, "--scale", 2, "--policies", "lb", "--out", tmp_path / "x2")
    sent = read_sent(tmp_path / "x2" / "requests_per_minute.csv")
    assert all(requests == 2 * recorded for recorded, requests in sent.values())
    assert "requests_per_minute.csv" in (tmp_path / "x2" / "report.html").read_text()


def test_a_2021_trace_with_more_functions_asked_than_it_holds(tmp_path, capsys):
    """The working set may exceed the trace's functions only where other minutes exist to take."""
    trace = tmp_path / "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt"
    rows = [("A", "x", 60.0 * m + 30.0, 1.0) for m in range(8) if m not in (2, 3)]  # idle minutes 2-3
    rows += [("A", "x", 4 * 60.0 + i / 10, 0.05) for i in range(200)]  # a burst in minute 4
    rows += [("B", "y", 7 * 60.0 + 5, 2.0)]
    trace.write_text("app,func,end_timestamp,duration\n" + "".join(f"{a},{f},{e},{d}\n" for a, f, e, d in rows))
    rc, out, err = run(capsys, "--trace", trace, "--working-set", 3, "--reuse-functions", "--out", tmp_path / "o")
    assert rc == 2 and "3 functions asked for; the trace's 2 functions give only 2 distinct 8-minute windows" in err
    rc, out, err = run(
        capsys,
        "--trace",
        trace,
        "--minutes",
        4,
        "--working-set",
        3,
        "--reuse-functions",
        "--policies",
        "lb",
        "--out",
        tmp_path / "o",
    )
    assert rc == 0, err
    assert "reusing each function's series at start minutes 0, 3, 4, the top 3 of these 6 windows" in err
    sent = read_sent(tmp_path / "o" / "requests_per_minute.csv")
    recorded = Counter((f"{app}-{func}", int((end - duration) // 60)) for app, func, end, duration in rows)
    for (name, minute), (rec, requests) in sent.items():
        base, _, start = name.partition("@")
        assert rec == requests == recorded[(base, minute)], (name, minute)
        assert minute - int(start or 0) in range(4)  # a reused window replays its own minutes
    assert out[0]["requests"] == sum(r for _, r in sent.values())


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--trace", "{tmp}/missing.csv"], "--trace: {tmp}/missing.csv not found"),
        (["--trace", "{trace}", "--cluster", "3x4"], "--cluster: '3x4' is not NODESxGPUS:MEMORY"),
        (["--trace", "{trace}", "--cluster", "3x4:8"], "--cluster: '3x4:8': the GPU memory needs a unit"),
        (["--trace", "{trace}", "--cluster", "2x2:1GB"], "--cluster: 1024 MB per GPU is less than"),
        (["--trace", "{trace}", "--minutes", "9"], "--minutes: the trace has 3 minutes, asked for 0..9"),
        (["--trace", "{trace}", "--working-set", "5"], "--working-set: 5 functions asked for, the trace holds 2"),
        (["--trace", "{tmp}/notes.txt"], "--trace: notes.txt is not an Azure Functions 2019 CSV"),
        (["--trace", "{trace}", "--models", "{tmp}/m.yaml"], "--models: {tmp}/m.yaml not found"),
        (["--trace", "{trace}", "--policies", "lb,fifo"], "--policies: unknown policy 'fifo'"),
        ([str(SCENARIO), "--minutes", "3"], "--minutes: only with --trace"),
        ([], "give a scenario file or --trace FILE.csv"),
    ],
)
def test_bad_input_is_refused_naming_the_flag(tmp_path, capsys, argv, flag):
    trace = azure2019(tmp_path, [[1, 2, 0], [0, 1, 1]])
    (tmp_path / "notes.txt").write_text("just some notes\n")
    argv = [a.format(tmp=tmp_path, trace=trace) for a in argv]
    rc, lines, err = run(capsys, *argv, "--out", tmp_path / "o")
    assert rc == 2 and not lines
    assert flag.format(tmp=tmp_path) in err
    assert not (tmp_path / "o").exists()


def test_cluster_specs_and_presets():
    assert parse_cluster("3x4:8GB") == parse_cluster("gpu-faas")
    c = parse_cluster("2 x 1 : 16000MB")
    assert (c.nodes, c.units_per_node, c.unit_memory_mb) == (2, 1, 16000.0)
    assert parse_cluster("protean").unit_memory_mb == 40 * 1024  # GB = 1024 MB, as GPU memory is quoted
    with pytest.raises(ValueError, match="must be positive"):
        parse_cluster("0x4:8GB")


def test_a_scenario_runs_on_another_cluster(tmp_path, capsys):
    rc, lines, err = run(capsys, SCENARIO, "--cluster", "1x4:8GB", "--policies", "lalb", "--out", tmp_path / "o")
    assert rc == 0, err
    rc, base, _ = run(capsys, SCENARIO, "--policies", "lalb", "--out", tmp_path / "o")
    assert lines[0]["requests"] == base[0]["requests"]
    assert lines[0]["avg_latency_s"] > base[0]["avg_latency_s"]  # a third of the GPUs: longer queues


def test_the_timeline_accounts_for_every_dispatch_and_the_memory_held():
    scenario = load_scenario(SCENARIO)
    r = simulate(scenario, "lb")
    assert len(r.dispatch_times) == r.hits + r.misses == len(r.latencies)
    assert int((~r.dispatch_hits).sum()) == r.misses
    mb = np.array([m for _, m in r.memory_steps])
    times = [t for t, _ in r.memory_steps]
    assert times == sorted(times) and (mb >= 0).all() and (mb <= r.memory_capacity_mb + 1e-6).all()
    cl = scenario.cluster
    assert r.memory_capacity_mb == cl.nodes * cl.units_per_node * cl.unit_memory_mb
    assert mb.max() / r.memory_capacity_mb <= r.peak_memory_ratio + 1e-9


def test_curves_are_drawn_with_the_papers_points(tmp_path):
    panel = Panel(
        "latency",
        "load",
        "s",
        [Series("LB", [1, 2, 3], [1.0, 4.0, 9.0], "tab:blue")],
        [Mark(2, 5.0, "LB")],
        vline=2,
        hlines=[(3.0, "base")],
        log_y=True,
    )
    path = plot_panels(tmp_path / "f" / "c.png", [panel, panel, panel], "t", ncols=2)
    assert path.read_bytes()[:8] == PNG and path.stat().st_size < 200_000


def test_your_own_models_from_a_file(tmp_path, capsys):
    models = tmp_path / "models.yaml"
    models.write_text(
        "- {name: tiny, size_mb: 300, load_s: 0.5, infer_s: 0.05}\n"
        "- {name: small, size_mb: 600, load_s: 1, infer_s: 0.1}\n"
    )
    trace = azure2019(tmp_path, [[3, 1], [2, 2], [1, 0]])
    rc, lines, err = run(capsys, "--trace", trace, "--models", models, "--cluster", "1x1:1GB", "--out", tmp_path / "o")
    assert rc == 0, err
    assert all(r["requests"] == 9 for r in lines) and "models " + str(models) in err
    models.write_text("- {name: tiny, size_mb: -1, load_s: 0.5, infer_s: 0.05}\n")
    rc, _, err = run(capsys, "--trace", trace, "--models", models, "--out", tmp_path / "o")
    assert rc == 2 and "--models: models.tiny.size_mb: must be positive" in err
