"""The simulator: conservation on random scenarios, determinism, CLI outputs, bad scenarios."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faas_gpu.paths import REPO_ROOT
from faas_gpu.sim import ScenarioError, load_scenario, parse_scenario, simulate

SCENARIO = REPO_ROOT / "faas_gpu" / "sim" / "scenarios" / "gpu_faas_ws15.yaml"


def write_trace(tmp_path, counts, name="t.txt"):
    path = tmp_path / name
    path.write_text("\n".join(str(c) for c in counts) + "\n")
    return path


def scenario_dict(trace_files, **over):
    data = {
        "seed": 3,
        "cluster": {"nodes": 1, "units_per_node": 3, "unit_memory_mb": 4000},
        "models": [
            {"name": "small", "size_mb": 1000, "load_s": 1.0, "infer_s": 0.5},
            {"name": "mid", "size_mb": 2000, "load_s": 2.0, "infer_s": 0.7},
            {"name": "big", "size_mb": 3500, "load_s": 3.0, "infer_s": 1.0},
        ],
        "trace": {"files": [str(f) for f in trace_files], "minutes": 2, "requests_per_minute": 40, "working_set": 3},
        "policy": {"name": "lalb_o3", "o3_limit": 5},
    }
    for k, v in over.items():
        data[k] = v
    return data


def check_conservation(result, n_requests, capacity_ok=True):
    assert sorted(result.completed_ids) == list(range(n_requests))  # each request exactly once
    for spans in result.unit_intervals.values():  # one job at a time per unit
        spans = sorted(spans)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-9
    assert result.peak_memory_ratio <= 1.0 + 1e-9


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    counts=st.lists(st.integers(0, 30), min_size=4, max_size=8).filter(lambda c: sum(c[:2]) > 0),
    units=st.integers(1, 4),
    memory=st.sampled_from([3500, 4000, 8000]),
    rpm=st.integers(1, 80),
    ws=st.integers(1, 6),
    policy=st.sampled_from(["lb", "lalb", "lalb_o3"]),
    limit=st.integers(0, 10),
    seed=st.integers(0, 1000),
)
def test_conservation_on_random_scenarios(tmp_path, counts, units, memory, rpm, ws, policy, limit, seed):
    trace = write_trace(tmp_path, counts)
    data = scenario_dict(
        [trace],
        seed=seed,
        cluster={"nodes": 1, "units_per_node": units, "unit_memory_mb": memory},
        policy={"name": policy, "o3_limit": limit},
    )
    data["trace"].update(requests_per_minute=rpm, working_set=ws)
    scenario = parse_scenario(data)
    result = simulate(scenario)
    check_conservation(result, rpm * 2)


def test_same_seed_same_result_and_seed_matters():
    scenario = load_scenario(SCENARIO)
    a = simulate(scenario, "lalb_o3").summary()
    b = simulate(scenario, "lalb_o3").summary()
    assert a == b
    scenario.seed = 99
    assert simulate(scenario, "lalb_o3").summary() != a


def test_lalb_beats_lb_on_the_paper_setup():
    scenario = load_scenario(SCENARIO)
    lb = simulate(scenario, "lb").summary()
    lalb = simulate(scenario, "lalb").summary()
    assert lalb["miss_ratio"] < lb["miss_ratio"] and lalb["avg_latency_s"] < lb["avg_latency_s"]
    assert lb["requests"] == lalb["requests"] == 6 * 325


def test_cli_writes_csv_and_png(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "faas_gpu.cli", "sim", str(SCENARIO), "--policies", "lb,lalb_o3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["policy"] for r in lines] == ["lb", "lalb_o3"]
    assert {
        "avg_latency_s",
        "p50_latency_s",
        "p99_latency_s",
        "miss_ratio",
        "false_miss_ratio",
        "avg_top_model_duplicates",
        "sm_utilization",
    } <= set(lines[0])
    for name in ("summary.csv", "latencies.csv", "latency_cdf.png", "policies.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "latency_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d["cluster"].update(gpus=3), "cluster.gpus"),
        (lambda d: d["models"][0].update(size_mb=-5), "models.small.size_mb"),
        (lambda d: d["models"][2].update(size_mb=9000), "models.big.size_mb"),
        (lambda d: d["cluster"].update(unit_memory_mb=-1), "cluster.unit_memory_mb"),
        (lambda d: d["trace"].update(working_set=0), "trace.working_set"),
        (lambda d: d["trace"].update(files=["missing.txt"]), "trace.files[0]"),
        (lambda d: d["policy"].update(name="fifo"), "policy.name"),
        (lambda d: d.pop("trace"), "trace"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path, mutate, field):
    data = scenario_dict([write_trace(tmp_path, [1, 2, 3])])
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value).startswith(f"bad.yaml: {field}"), str(err.value)


def test_empty_trace_and_wrong_format_are_refused(tmp_path):
    zeros = write_trace(tmp_path, [0, 0, 0, 0], "zeros.txt")
    with pytest.raises(ScenarioError, match="empty trace"):
        simulate(parse_scenario(scenario_dict([zeros])))
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("HashOwner,HashApp\nnot,a number\n")
    with pytest.raises(ScenarioError, match="trace.files: garbage.txt line 1"):
        simulate(parse_scenario(scenario_dict([garbage])))
    blank = tmp_path / "blank.txt"
    blank.write_text("")
    with pytest.raises(ScenarioError, match="is empty"):
        simulate(parse_scenario(scenario_dict([blank])))
    not_azure = tmp_path / "x.csv"
    not_azure.write_text("a,b,c\n1,2,3\n")
    data = scenario_dict([zeros])
    data["trace"] = {"file": str(not_azure), "minutes": 1, "requests_per_minute": 5, "working_set": 1}
    with pytest.raises(ScenarioError, match="not an Azure Functions 2019 CSV"):
        simulate(parse_scenario(data))


def test_azure_2019_csv_is_read(tmp_path):
    header = ["HashOwner", "HashApp", "HashFunction", "Trigger"] + [str(i) for i in range(1, 11)]
    rows = [header] + [["o", "a", f"f{i}", "http"] + [str((i + 1) * j) for j in range(10)] for i in range(5)]
    path = tmp_path / "invocations_per_function_md.anon.d01.csv"
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    data = scenario_dict([path])
    data["trace"] = {"file": str(path), "minutes": 3, "start_minute": 2, "requests_per_minute": 20, "working_set": 3}
    result = simulate(parse_scenario(data))
    check_conservation(result, 60)
