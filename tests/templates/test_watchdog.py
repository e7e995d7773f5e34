"""The watchdog (templates/python3-gpu/fwatchdog.py) as a real process over real HTTP."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import requests

from faas_gpu.paths import TEMPLATES_DIR
from tests.stack_process import free_port

TEMPLATE = TEMPLATES_DIR / "python3-gpu"


class Watchdog:
    def __init__(self, tmp: Path, env: dict[str, str], cwd: Path | None = None):
        self.port = free_port()
        self.tmpdir = tmp / f"wd-{self.port}"
        self.tmpdir.mkdir()
        self.log = self.tmpdir / "out.log"
        full_env = {
            **os.environ,
            "port": str(self.port),
            "metrics_port": "0",
            "bind_address": "127.0.0.1",
            "TMPDIR": str(self.tmpdir),
            "healthcheck_interval": "100ms",
            **env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, str((cwd or TEMPLATE) / "fwatchdog.py")],
            env=full_env,
            cwd=cwd or self.tmpdir,
            stdout=open(self.log, "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, path: str = "/_/ready", timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if requests.get(self.url + path, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise AssertionError(self.log.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def watchdogs(tmp_path):
    started: list[Watchdog] = []

    def start(env: dict[str, str], cwd: Path | None = None, wait: bool = True) -> Watchdog:
        wd = Watchdog(tmp_path, env, cwd)
        started.append(wd)
        if wait:
            wd.wait()
        return wd

    yield start
    for wd in started:
        wd.stop()


HANDLER = """
import time

def handle(event, context):
    if event.path == "/raise":
        raise RuntimeError("handler exploded")
    if event.path == "/hang":
        time.sleep(30)
    if event.path == "/none":
        return None
    if event.path == "/list-headers":
        return {"statusCode": 202, "body": "ok", "headers": [("X-List", "1")]}
    return {"statusCode": 201, "body": {"echo": event.body.decode(), "method": event.method,
            "query": dict(event.query), "host": context.hostname}, "headers": {"X-Custom": "yes"}}
"""


@pytest.fixture
def function_dir(tmp_path):
    """The template with a test handler, as `faas-gpu build` lays it out."""
    ctx = tmp_path / "ctx"
    shutil.copytree(TEMPLATE, ctx, ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "function" / "handler.py").write_text(textwrap.dedent(HANDLER))
    return ctx


def http_env(**extra: str) -> dict[str, str]:
    return {
        "mode": "http",
        "fprocess": f"{sys.executable} index.py",
        "upstream_url": f"http://127.0.0.1:{free_port()}",
        **extra,
    }


# -- http mode with the real index.py ----------------------------------------------------
def test_http_mode_dict_body_status_and_headers(watchdogs, function_dir):
    wd = watchdogs(http_env(), cwd=function_dir)
    r = requests.post(f"{wd.url}/any?x=1", data=b"hi", timeout=10)
    assert r.status_code == 201
    assert r.headers["Content-Type"] == "application/json" and r.headers["X-Custom"] == "yes"
    assert float(r.headers["X-Duration-Seconds"]) >= 0
    assert r.json() == {"echo": "hi", "method": "POST", "query": {"x": "1"}, "host": "localhost"}
    r = requests.get(f"{wd.url}/none", timeout=10)
    assert r.status_code == 200 and r.content == b""
    r = requests.put(f"{wd.url}/list-headers", timeout=10)
    assert r.status_code == 202 and r.headers["X-List"] == "1"


def test_handler_that_raises_gives_500_and_instance_survives(watchdogs, function_dir):
    wd = watchdogs(http_env(), cwd=function_dir)
    r = requests.post(f"{wd.url}/raise", timeout=10)
    assert r.status_code == 500 and "handler exploded" in r.text
    assert requests.post(f"{wd.url}/ok", data=b"again", timeout=10).status_code == 201


def test_hang_times_out_with_504_and_x_timeout_shortens(watchdogs, function_dir):
    wd = watchdogs(http_env(exec_timeout="2s"), cwd=function_dir)
    t0 = time.monotonic()
    r = requests.post(f"{wd.url}/hang", headers={"X-Timeout": "500ms"}, timeout=20)
    assert r.status_code == 504 and time.monotonic() - t0 < 2
    r = requests.post(f"{wd.url}/hang", headers={"X-Timeout": "60s"}, timeout=20)  # never lengthens
    assert r.status_code == 504
    assert requests.post(f"{wd.url}/ok", timeout=10).status_code == 201


def test_max_inflight_answers_429(watchdogs, function_dir):
    wd = watchdogs(http_env(max_inflight="1", exec_timeout="3s"), cwd=function_dir)
    slow = threading.Thread(target=lambda: requests.post(f"{wd.url}/hang", timeout=10))
    slow.start()
    time.sleep(0.5)
    assert requests.post(f"{wd.url}/ok", timeout=10).status_code == 429
    assert requests.get(f"{wd.url}/_/ready", timeout=10).status_code == 429
    slow.join()


def test_chunked_body_and_oversized_body(watchdogs, function_dir):
    wd = watchdogs(http_env(max_body_bytes="100"), cwd=function_dir)
    r = requests.post(f"{wd.url}/c", data=iter([b"ab", b"cd"]), timeout=10)
    assert r.json()["echo"] == "abcd"
    assert requests.post(f"{wd.url}/c", data=b"x" * 200, timeout=10).status_code == 413
    assert requests.post(f"{wd.url}/c", data=iter([b"x" * 60, b"x" * 60]), timeout=10).status_code == 413


def test_ready_waits_for_upstream_and_health_follows_lock(watchdogs, function_dir):
    (function_dir / "function" / "handler.py").write_text("import time\ntime.sleep(1.5)\n" + HANDLER)
    wd = watchdogs(http_env(), cwd=function_dir, wait=False)
    wd.wait("/_/health")
    assert requests.get(f"{wd.url}/_/ready", timeout=5).status_code == 503
    wd.wait("/_/ready")
    assert requests.post(f"{wd.url}/_/health", timeout=5).status_code == 405
    os.remove(wd.tmpdir / ".lock")
    assert requests.get(f"{wd.url}/_/health", timeout=5).status_code == 503


def test_run_healthcheck_flag(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, str(TEMPLATE / "fwatchdog.py"), "-run-healthcheck"]
    assert subprocess.run(cmd, env=env).returncode == 1
    (tmp_path / ".lock").touch()
    assert subprocess.run(cmd, env=env).returncode == 0


def test_sigterm_drains_inflight_then_exits_zero(watchdogs, function_dir):
    (function_dir / "function" / "handler.py").write_text(
        "import time\ndef handle(event, context):\n    time.sleep(1.5)\n    return {'body': 'done'}\n"
    )
    wd = watchdogs(http_env(write_timeout="10s"), cwd=function_dir)
    result = {}
    t = threading.Thread(target=lambda: result.update(r=requests.post(wd.url, timeout=20)))
    t.start()
    time.sleep(0.4)
    os.kill(wd.proc.pid, signal.SIGTERM)
    t.join()
    assert result["r"].status_code == 200 and result["r"].text == "done"
    assert wd.proc.wait(15) == 0
    assert not (wd.tmpdir / ".lock").exists()


def test_metrics_port(watchdogs, function_dir):
    mport = free_port()
    wd = watchdogs(http_env(metrics_port=str(mport)), cwd=function_dir)
    requests.post(f"{wd.url}/m", timeout=10)
    # the request is counted once its handler returns, which may be just after the client has the answer
    deadline = time.monotonic() + 10
    while True:
        text = requests.get(f"http://127.0.0.1:{mport}/metrics", timeout=5).text
        if 'http_requests_total{code="201",method="post"}' in text or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert 'http_requests_total{code="201",method="post"}' in text
    assert "http_request_duration_seconds_bucket" in text and "http_requests_in_flight" in text


# -- fork per request --------------------------------------------------------------------
def test_classic_cat_echoes_and_logs_certifier_lines(watchdogs):
    wd = watchdogs({"mode": "classic", "fprocess": "cat"})
    r = requests.post(wd.url, data=b"hello", timeout=10)
    assert r.status_code == 200 and r.content == b"hello"
    assert "X-Duration-Seconds" in r.headers
    time.sleep(0.2)
    out = wd.output()
    assert "Forking fprocess." in out and "Wrote 5 Bytes - Duration:" in out


def test_classic_env_gets_cgi_variables(watchdogs):
    wd = watchdogs({"mode": "classic", "fprocess": "env"})
    r = requests.post(f"{wd.url}/a/b?q=1", data=b"xyz", headers={"X-Custom-Header": "v"}, timeout=10)
    env = dict(line.split("=", 1) for line in r.text.splitlines() if "=" in line)
    assert env["Http_Method"] == "POST" and env["Http_Path"] == "/a/b" and env["Http_Query"] == "q=1"
    assert env["Http_X_Custom_Header"] == "v" and env["Http_Content_Length"] == "3"


def test_classic_nonzero_exit_is_500_and_timeout_is_408(watchdogs):
    wd = watchdogs({"mode": "classic", "fprocess": "sh -c 'echo oops; exit 3'"})
    r = requests.post(wd.url, timeout=10)
    assert r.status_code == 500 and "oops" in r.text
    wd2 = watchdogs({"mode": "classic", "fprocess": "sleep 10", "exec_timeout": "500ms"})
    assert requests.post(wd2.url, timeout=10).status_code == 408


def test_streaming_mode_timeout_is_504(watchdogs):
    wd = watchdogs({"mode": "streaming", "fprocess": "sleep 10", "exec_timeout": "500ms"})
    assert requests.post(wd.url, timeout=10).status_code == 504
    wd2 = watchdogs({"mode": "serializing", "fprocess": "cat"})
    r = requests.post(wd2.url, data=b"s", timeout=10)
    assert r.content == b"s" and r.headers["Content-Type"] == "application/octet-stream"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"mode": "afterburn", "fprocess": "cat"}, "unknown mode"),
        ({"mode": "classic"}, "fprocess"),
        ({"mode": "http", "fprocess": "cat"}, "upstream_url"),
        ({"mode": "classic", "fprocess": "cat", "exec_timeout": "soon"}, "exec_timeout"),
    ],
)
def test_bad_configuration_exits_with_a_clear_error(tmp_path, env, message):
    proc = subprocess.run(
        [sys.executable, str(TEMPLATE / "fwatchdog.py")],
        env={**os.environ, "TMPDIR": str(tmp_path), "port": str(free_port()), **env},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode != 0 and message in proc.stderr


def test_template_handler_test_passes():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "function/handler_test.py"],
        cwd=TEMPLATE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
