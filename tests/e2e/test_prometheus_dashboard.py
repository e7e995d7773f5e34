"""The files in deploy/ for Prometheus and Grafana, checked without a stack (fast).

Every metric a dashboard query names is one the stack exports: a `faas_gpu_*` / `nv_*` name of the
contract (faas_gpu/contract/metrics.py), or an OpenFaaS name the provider exports
(provider/metrics.py); the scrape configurations have a job per daemon, the token where one is
asked for, and pass `promtool check config`; the compose and swarm files parse and mount them.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from faas_gpu.contract import metrics as m
from faas_gpu.paths import REPO_ROOT
from provider.metrics import GatewayMetrics, ProviderMetrics
from tests.prometheus import (
    DASHBOARD,
    JOBS,
    PROMETHEUS_CONFIG,
    SWARM_CONFIG,
    TOKEN_JOBS,
    dashboard_queries,
    metric_names,
    scrape_config,
    substitute,
)

DEPLOY = REPO_ROOT / "deploy"
PROMETHEUS_OWN = {"up"}  # the series Prometheus writes for every target


def _series_names(family_type: str, name: str) -> set[str]:
    """The series names a family of this type is queried by."""
    if family_type == "counter":
        return {f"{name}_total"}
    if family_type == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def exported_names() -> set[str]:
    names: set[str] = set()
    for spec in m.SPECS:
        kind = spec.kind.value if spec.kind is not m.Kind.COUNTER else "counter"
        names |= _series_names(kind, m.family_name(spec))
    gateway = GatewayMetrics(lambda: {"f.openfaas-fn": 1})
    gateway.started("f.openfaas-fn")
    gateway.finished("f.openfaas-fn", 200, 0.1)
    provider = ProviderMetrics()
    provider.requests.labels("200", "GET", "/x").inc()
    provider.duration.labels("200", "GET", "/x").observe(0.1)
    from prometheus_client import generate_latest

    for registry in (gateway.registry, provider.registry):
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            names |= _series_names(family.type, family.name)
    return names


def test_metric_names_are_read_from_promql():
    expr = 'sum by (function, le) (rate(x_bucket{slo="within", a=~"b|c"}[$__rate_interval])) / on(job) y or vector(0)'
    assert metric_names(expr) == {"x_bucket", "y"}
    assert metric_names("1 - sum(a_total) / sum(b) * 3600") == {"a_total", "b"}


def test_every_dashboard_query_names_an_exported_metric():
    queries = dashboard_queries()
    assert len(queries) >= 20
    exported = exported_names()
    assert "gateway_function_invocation_total" in exported and "nv_gpu_utilization" in exported
    named: set[str] = set()
    for title, expr in queries:
        names = metric_names(substitute(expr))
        assert names, (title, expr)
        unknown = names - exported - PROMETHEUS_OWN
        assert not unknown, f"{title}: {expr} names {unknown}, which the stack does not export"
        named |= names
    # what the operator is promised: each of these is on the dashboard
    for name in (
        "nv_gpu_memory_used_bytes",
        "nv_gpu_utilization",
        "faas_gpu_model_cache_hits_total",
        "faas_gpu_model_cache_misses_total",
        "faas_gpu_queue_depth",
        "faas_gpu_batch_size_bucket",
        "faas_gpu_slo_jobs_total",
        "gateway_function_invocation_total",
        "faas_gpu_placement_duration_seconds_bucket",
        "faas_gpu_mig_reconfigurations_total",
        "faas_gpu_procurement_nodes",
        "faas_gpu_procurement_dollars_total",
    ):
        assert name in named, name


def test_the_dashboard_is_grafanas_shape_on_the_provisioned_data_source():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "faas-gpu" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    source = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert source["datasources"][0]["uid"] == "prometheus"
    variable = dash["templating"]["list"][0]
    assert variable["type"] == "datasource" and variable["current"]["value"] == "prometheus"
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}" and target["refId"]


@pytest.mark.parametrize("path", [PROMETHEUS_CONFIG, SWARM_CONFIG], ids=lambda p: p.name)
def test_the_scrape_configurations_have_every_daemon_and_pass_promtool(path, tmp_path):
    config = yaml.safe_load(path.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    swarm = path == SWARM_CONFIG  # no procurer in a Swarm stack; the token is a Swarm secret there
    assert set(jobs) == (JOBS - {"procurer"} if swarm else JOBS)
    for name, job in jobs.items():
        auth = job.get("authorization")
        if name in TOKEN_JOBS:
            token = "/run/secrets/gpu-manager-token" if swarm else "/var/lib/faas-gpu/secrets/gpu-manager-token"
            assert auth["credentials_file"] == token
        else:
            assert auth is None
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool: apt-get install prometheus (make servers)")
    token = tmp_path / "gpu-manager-token"
    token.write_text("t")
    checked = tmp_path / "prometheus.yml"
    targets = {job: ["127.0.0.1:1"] for job in JOBS}
    checked.write_text(yaml.safe_dump(scrape_config(targets, token, base=path)))
    out = subprocess.run([promtool, "check", "config", str(checked)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_and_swarm_start_prometheus_and_grafana_with_these_files():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    swarm = yaml.safe_load((DEPLOY / "swarm-stack.yml").read_text())
    # the cluster token: the state volume on one box, the Swarm secret in a cluster
    for stack, config, token in (
        (compose, "prometheus.yml", "/var/lib/faas-gpu"),
        (swarm, "prometheus-swarm.yml", "faas-gpu-cluster-token"),
    ):
        services = stack["services"]
        assert {"faas-gpu", "prometheus", "grafana"} <= set(services)
        mounted = json.dumps(services["prometheus"]) + json.dumps(stack.get("configs", {}))
        assert config in mounted and token in mounted
        grafana = json.dumps(services["grafana"]) + json.dumps(stack.get("configs", {}))
        assert "faas-gpu.json" in grafana or "grafana/" in grafana
        assert "PROMETHEUS_URL" in grafana
