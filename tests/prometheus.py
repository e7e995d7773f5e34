"""A real Prometheus for tests (Debian's `prometheus` package), and the Grafana dashboard's queries.

Prometheus runs on a free loopback port with its own TSDB folder, over a configuration made from
deploy/prometheus/prometheus.yml with the test stack's addresses and token file, and is stopped by
the context manager. Tests that need it are skipped without the binary (`make servers` installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import yaml

from faas_gpu.paths import REPO_ROOT
from faas_gpu.ports import free_port

PROMETHEUS_CONFIG = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
SWARM_CONFIG = REPO_ROOT / "deploy" / "prometheus" / "prometheus-swarm.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "faas-gpu.json"
JOBS = {"gateway", "provider", "scheduler", "gpu-manager", "procurer"}
TOKEN_JOBS = {"scheduler", "gpu-manager"}  # the daemons that ask for the cluster token on /metrics

# Grafana's built-in variables, fixed for a query sent straight to Prometheus's API: windows long
# enough to hold a test's few scrapes at a 1 s interval.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "5s"}


def require_prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("no prometheus: apt-get install prometheus (make servers)")
    return path


def scrape_config(
    targets: dict[str, list[str]], token_file: Path, interval: str = "1s", base: Path = PROMETHEUS_CONFIG
) -> dict:
    """deploy/prometheus/prometheus.yml with `targets` per job and `token_file` as the cluster token."""
    config = yaml.safe_load(base.read_text())
    config["global"]["scrape_interval"] = interval
    config["global"]["evaluation_interval"] = interval
    for job in config["scrape_configs"]:
        job.pop("dns_sd_configs", None)  # prometheus-swarm.yml finds tasks through Swarm's DNS
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token_file)
    return config


def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, rows' panels included."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            out.extend((panel["title"], t["expr"]) for t in panel.get("targets", []) if t.get("expr"))

    walk(json.loads(path.read_text())["panels"])
    return out


def substitute(expr: str) -> str:
    """A dashboard expression as Prometheus's API takes it: Grafana's variables replaced."""
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, label matchers, grouping labels,
    durations and keywords left out). Enough for the dashboard's expressions, not all of PromQL."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range windows
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if match.group(2) or match.group(1) in _KEYWORDS:
            continue  # a function call or an operator word
        names.add(match.group(1))
    return names


@contextmanager
def prometheus(config: dict, root: Path) -> Iterator[str]:
    """A running Prometheus over `config` (its folder under `root`): its URL; stopped on exit."""
    binary = require_prometheus()
    root.mkdir(parents=True, exist_ok=True)
    config_file = root / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = root / "prometheus.log"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=open(log, "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{log.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def query(url: str, expr: str) -> list[dict]:
    """The instant vector (or scalar, as one sample) Prometheus's HTTP API answers for `expr`."""
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    data = body["data"]
    return data["result"] if data["resultType"] in ("vector", "matrix") else [{"value": data["result"]}]
