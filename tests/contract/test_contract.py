"""The cross-process contract (faas_gpu/contract): one parser per fact, no daemon imported."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from faas_gpu.contract import env, errors, headers, keys, slo
from faas_gpu.contract.duration import parse_duration
from faas_gpu.paths import REPO_ROOT, TEMPLATES_DIR
from tests.module_files import load

CONTRACT = REPO_ROOT / "faas_gpu" / "contract"
OURS = {"faas_gpu", "provider", "scheduler", "gpu_manager"}


@pytest.mark.parametrize("path", sorted(CONTRACT.glob("*.py")), ids=lambda p: p.name)
def test_the_contract_imports_nothing_of_ours(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            assert (node.module or "").split(".")[0] not in OURS
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] not in OURS for a in node.names)


def test_the_scheduler_and_the_client_import_no_gpu_manager():
    for folder in ("scheduler", "faas_gpu", "provider"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                assert not any(n.split(".")[0] == "gpu_manager" for n in names), f"{path} imports {names}"


def test_an_slo_is_a_budget_in_ms_and_a_bad_one_names_its_header():
    asked = slo.parse_request({headers.CLASS: " Strict ", headers.SLO_MS: "250"})
    assert (asked.request_class, asked.slo_ms) == (slo.RequestClass.STRICT, 250.0)
    assert slo.parse_request({}) == slo.RequestSlo(None, None)
    for bad in ({headers.CLASS: "urgent"}, {headers.SLO_MS: "-1"}, {headers.SLO_MS: "abc"}):
        with pytest.raises(ValueError, match="^X-Faas-Gpu-"):
            slo.parse_request(bad)
    # behind the gateway a bad header counts as absent
    assert slo.read_request({headers.CLASS: "urgent", headers.SLO_MS: "100"}) == slo.RequestSlo(None, 100.0)


def test_the_gateway_forwards_the_class_and_slo_as_it_parsed_them():
    raw = {headers.CLASS: " Strict ", headers.SLO_MS: "250.0", "X-Other": "kept"}
    out = slo.parse_request(raw).forwarded(raw)
    assert out == {headers.CLASS: "strict", headers.SLO_MS: "250", "X-Other": "kept"}
    assert slo.read_request(out) == slo.parse_request(raw)  # the instance reads what the gateway parsed
    empty = {headers.CLASS: "", headers.SLO_MS: " "}
    assert slo.parse_request(empty).forwarded(empty) == {}
    big = {headers.SLO_MS: "3599999.125"}
    assert slo.parse_request(big).forwarded(big)[headers.SLO_MS] == "3599999.125"


def test_the_budget_left_is_what_the_scheduler_turns_into_a_deadline():
    assert slo.parse_budget_ms(" 12.5 ") == 12.5 and slo.parse_budget_ms("-3") == -3.0
    assert slo.parse_budget_ms(None) is None and slo.parse_budget_ms("") is None
    with pytest.raises(ValueError, match="X-Faas-Gpu-Deadline-Ms"):
        slo.parse_budget_ms("nan")
    b = slo.Budget(100.0, start=10.0)
    assert b.header(10.04) == "60.000" and b.remaining_ms(11.0) == 0.0


def test_one_default_per_variable():
    assert env.MAX_BATCH.read({}) == 8 and env.MAX_BATCH.read({"FAAS_GPU_MAX_BATCH": " "}) == 8
    assert env.MAX_BATCH.read({"FAAS_GPU_MAX_BATCH": "4"}) == 4
    assert env.SCHEDULER_URL.read({"FAAS_GPU_SCHEDULER_URL": "http://a/, ,http://b"}) == ("http://a", "http://b")
    assert env.batch_timeout_s({}) == 0.005
    assert env.batch_timeout_s({"FAAS_GPU_SLO_MS": "200"}) == 0.05
    assert env.batch_timeout_s({"FAAS_GPU_SLO_MS": "200", "FAAS_GPU_BATCH_TIMEOUT_MS": "0"}) == 0.0
    assert env.instance_threads({}) == 8 and env.instance_threads({"FAAS_GPU_MAX_BATCH": "16"}) == 32


def test_typed_errors_carry_a_code_not_a_text():
    exc = errors.ModelNotUploaded("model: abc… has not been uploaded")
    assert isinstance(exc, LookupError) and exc.status == 404
    assert errors.code_of(errors.error_headers(exc)) == "model-not-uploaded"
    assert errors.code_of({}) is None
    assert issubclass(errors.WireError, ValueError) and errors.ArtifactTooLarge.status == 413


def test_keys_are_under_one_root():
    assert keys.unit("n1", "cpu-0") == "/faas-gpu/units/n1/cpu-0"
    for name in ("UNITS", "FUNCTIONS", "FN_CREDENTIALS", "FN_MODELS", "SCHEDULER_MEMBERS", "CORDON", "INSTANCES"):
        value = getattr(keys, name)
        assert value.startswith(keys.ROOT) and value.endswith("/")


DURATIONS = ["30", "1.5", "10s", "1m30s", "500ms", "1h30m", "1.5h", ".5s", "1.s", "2us", "3µs", "4ns", "2562047h"]
NOT_DURATIONS = ["", "soon", "1x", "s", "1m 30s", "-1s", "1.", "10S", "99999999999h", "2562048h", "9999999999"]


def _watchdog_parser():
    path = Path(TEMPLATES_DIR / "python3-gpu" / "faas_gpu_watchdog" / "durations.py")
    return load("fwatchdog_durations_copy", path).parse_duration


def test_one_duration_grammar_and_the_watchdogs_copy_agrees():
    watchdog = _watchdog_parser()
    for text in DURATIONS:
        assert math.isclose(parse_duration(text), watchdog(text, "t")), text
    for text in NOT_DURATIONS:
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(text, "t")
        with pytest.raises(SystemExit):
            watchdog(text, "t")
    assert parse_duration("1h30m") == 5400 and parse_duration(7) == 7.0


def test_one_table_of_gos_reason_phrases_and_the_watchdogs_copy_agrees():
    """Every status line we write by hand (the gateway's proxied answers, Flask's routes, the
    watchdog) takes its reason from one table of Go's (`http_status`); the watchdog keeps a copy."""
    from faas_gpu.contract import http_status

    copy = load("fwatchdog_status_copy", TEMPLATES_DIR / "python3-gpu" / "faas_gpu_watchdog" / "status.py")
    assert copy.REASONS == http_status.REASONS
    assert http_status.status_line(401) == "401 Unauthorized" and copy.reason(401) == "Unauthorized"
    assert http_status.status_line(599) == "599 status code 599" == f"599 {copy.reason(599)}"
    status = re.compile(r"(\d{3}) ([A-Z][A-Za-z' -]+)")
    for path in [*REPO_ROOT.glob("provider/**/*.py"), *TEMPLATES_DIR.glob("python3-gpu/**/*.py")]:
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if found := status.fullmatch(node.value):
                    assert http_status.reason(int(found[1])) == found[2], f"{path}: {node.value!r} is not Go's"


# -- metrics -------------------------------------------------------------------------------------
def test_every_metric_has_a_conventional_name_help_and_bounded_labels():
    from faas_gpu.contract import metrics as m

    label_re = re.compile(r"^[a-z_][a-z0-9_]*$")
    for spec in m.SPECS:
        assert spec.name.startswith(("faas_gpu_", "nv_")), spec.name
        assert spec.help.strip(), spec.name
        assert spec.name.endswith("_total") == (spec.kind is m.Kind.COUNTER), spec.name  # Triton's have none
        assert (spec.kind is m.Kind.EXACT_COUNTER) <= spec.name.startswith("nv_inference_"), spec.name
        assert spec.kind is not m.Kind.HISTOGRAM or spec.buckets, spec.name
        for label in spec.labels:
            assert label_re.match(label) and label not in ("le", "quantile"), (spec.name, label)
            assert label.split("_")[0] not in ("request", "job", "call", "trace"), (spec.name, label)  # unbounded


def _exported(tmp_path) -> dict[str, str]:
    """Each daemon's /metrics text, from the daemons' own objects in this process."""
    from faas_gpu.datastore import open_datastore
    from faas_gpu.models import ModelStore
    from gpu_manager.api import create_app as manager_app
    from gpu_manager.discovery import cpu_units
    from gpu_manager.manager import GPUManager
    from procurer.metrics import procurer_metrics
    from scheduler.api import create_app as scheduler_app
    from scheduler.core import Scheduler
    from scheduler.leader import LeaderElection

    auth = {"Authorization": "Bearer t"}
    manager = GPUManager(cpu_units(2, 64), ModelStore(tmp_path / "m"))
    ds = open_datastore(None, tmp_path / "state.db")
    scheduler = Scheduler(ds, ModelStore(tmp_path / "s"), "t")
    try:
        return {
            "gpu_manager": manager_app(manager, "t").test_client().get("/metrics", headers=auth).get_data(as_text=True),
            "scheduler": scheduler_app(scheduler, LeaderElection(ds, "me"), "t")
            .test_client()
            .get("/metrics", headers=auth)
            .get_data(as_text=True),
            "procurer": procurer_metrics(lambda: {}).exposition().decode(),
        }
    finally:
        manager.close()
        ds.close()


def test_every_contract_metric_is_exported_by_its_daemon_and_no_other_name_of_ours(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from faas_gpu.contract import metrics as m

    for daemon, text in _exported(tmp_path).items():
        lines = text.splitlines()
        helps = {line.split()[2] for line in lines if line.startswith("# HELP ")}
        typed = {line.split()[2] for line in lines if line.startswith("# TYPE ")}
        assert typed <= helps, f"{daemon}: families without HELP: {typed - helps}"
        families = list(text_string_to_metric_families(text))  # Prometheus's parser takes it
        assert all(f.documentation for f in families)
        ours = {name for name in helps if name.startswith(("faas_gpu_", "nv_"))}
        assert ours == {s.name for s in m.for_daemon(m.Daemon(daemon))}, daemon


def test_the_readme_lists_every_metric_as_the_contract_has_it():
    from faas_gpu.contract import metrics as m

    readme = (REPO_ROOT / "README.md").read_text()
    start, end = "<!-- metrics-table:start -->\n", "\n<!-- metrics-table:end -->"
    table = readme[readme.index(start) + len(start) : readme.index(end)]
    assert table == m.markdown(), "README's metrics table: paste `python -m faas_gpu.contract.metrics`"
    assert all(f"`{s.name}`" in table for s in m.SPECS)
