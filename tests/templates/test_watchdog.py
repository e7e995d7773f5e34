"""The watchdog (templates/python3-gpu/fwatchdog.py) as a real process over real HTTP."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import requests

from faas_gpu.paths import TEMPLATES_DIR
from faas_gpu.ports import free_port
from provider.runtime.launch import dockerfile_env
from tests.module_files import load

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


def inproc_env(**extra: str) -> dict[str, str]:
    return {"mode": "inproc", "fprocess": "python index.py", **extra}


@pytest.fixture(params=["http", "inproc"])
def serve_env(request):
    """The template's index.py behind the watchdog both ways: its own server proxied (http), and
    called in the watchdog's process (inproc, the template's default)."""
    return http_env if request.param == "http" else inproc_env


# -- the real index.py, proxied (http) and in process (inproc) ---------------------------
def test_dict_body_status_and_headers(watchdogs, function_dir, serve_env):
    wd = watchdogs(serve_env(), cwd=function_dir)
    r = requests.post(f"{wd.url}/any?x=1", data=b"hi", timeout=10)
    assert r.status_code == 201
    assert r.headers["Content-Type"] == "application/json" and r.headers["X-Custom"] == "yes"
    assert float(r.headers["X-Duration-Seconds"]) >= 0
    assert r.json() == {"echo": "hi", "method": "POST", "query": {"x": "1"}, "host": "localhost"}
    r = requests.get(f"{wd.url}/none", timeout=10)
    assert r.status_code == 200 and r.content == b""
    r = requests.put(f"{wd.url}/list-headers", timeout=10)
    assert r.status_code == 202 and r.headers["X-List"] == "1"


def test_http_mode_answers_carry_the_upstreams_one_date_and_one_server(watchdogs, function_dir):
    """of-watchdog copies the upstream's headers and Go adds a Date only when none is set: one
    each, the upstream's (waitress here), never the watchdog's beside them."""
    import http.client

    wd = watchdogs(http_env(), cwd=function_dir)
    conn = http.client.HTTPConnection("127.0.0.1", int(wd.url.rsplit(":", 1)[1]), timeout=10)
    conn.request("GET", "/none")
    r = conn.getresponse()
    r.read()
    assert len(r.msg.get_all("Date")) == 1 and len(r.msg.get_all("Server")) == 1
    assert "fwatchdog" not in r.msg["Server"]
    conn.request("GET", "/_/health")  # the watchdog's own answers keep its own
    r = conn.getresponse()
    r.read()
    assert len(r.msg.get_all("Date")) == 1 and r.msg["Server"].startswith("fwatchdog")
    # its own Date is this second's, in the IMF-fixdate form (made once a second, not per answer)
    import email.utils

    assert r.msg["Date"].endswith(" GMT")
    assert abs(email.utils.parsedate_to_datetime(r.msg["Date"]).timestamp() - time.time()) < 3
    conn.close()


def test_handler_that_raises_gives_500_and_instance_survives(watchdogs, function_dir, serve_env):
    wd = watchdogs(serve_env(), cwd=function_dir)
    r = requests.post(f"{wd.url}/raise", timeout=10)
    assert r.status_code == 500 and "handler exploded" in r.text
    assert requests.post(f"{wd.url}/ok", data=b"again", timeout=10).status_code == 201


def test_hang_times_out_with_504_and_x_timeout_shortens(watchdogs, function_dir, serve_env):
    wd = watchdogs(serve_env(exec_timeout="2s"), cwd=function_dir)
    t0 = time.monotonic()
    r = requests.post(f"{wd.url}/hang", headers={"X-Timeout": "500ms"}, timeout=20)
    assert r.status_code == 504 and time.monotonic() - t0 < 2
    r = requests.post(f"{wd.url}/hang", headers={"X-Timeout": "60s"}, timeout=20)  # never lengthens
    assert r.status_code == 504
    assert requests.post(f"{wd.url}/ok", timeout=10).status_code == 201


def test_max_inflight_answers_429(watchdogs, function_dir, serve_env):
    wd = watchdogs(serve_env(max_inflight="1", exec_timeout="3s"), cwd=function_dir)
    slow = threading.Thread(target=lambda: requests.post(f"{wd.url}/hang", timeout=10))
    slow.start()
    time.sleep(0.5)
    assert requests.post(f"{wd.url}/ok", timeout=10).status_code == 429
    assert requests.get(f"{wd.url}/_/ready", timeout=10).status_code == 429
    slow.join()


def test_chunked_body_and_oversized_body(watchdogs, function_dir, serve_env):
    wd = watchdogs(serve_env(max_body_bytes="100"), cwd=function_dir)
    r = requests.post(f"{wd.url}/c", data=iter([b"ab", b"cd"]), timeout=10)
    assert r.json()["echo"] == "abcd"
    assert requests.post(f"{wd.url}/c", data=b"x" * 200, timeout=10).status_code == 413
    assert requests.post(f"{wd.url}/c", data=iter([b"x" * 60, b"x" * 60]), timeout=10).status_code == 413


def test_ready_waits_for_the_function_and_health_follows_lock(watchdogs, function_dir, serve_env):
    (function_dir / "function" / "handler.py").write_text("import time\ntime.sleep(1.5)\n" + HANDLER)
    wd = watchdogs(serve_env(), cwd=function_dir, wait=False)
    wd.wait("/_/health")
    assert requests.get(f"{wd.url}/_/ready", timeout=5).status_code == 503
    wd.wait("/_/ready")
    assert requests.post(f"{wd.url}/_/health", timeout=5).status_code == 405
    os.remove(wd.tmpdir / ".lock")
    assert requests.get(f"{wd.url}/_/health", timeout=5).status_code == 503


def test_ready_says_why_when_the_handler_failed_to_load(watchdogs, function_dir, serve_env):
    """The template's readiness check (its Dockerfile's `ready_path`): 500 and the handler's error
    while it cannot load, so a runtime never calls the replica Ready (faas_gpu.contract.readiness);
    200 once it has loaded. In http mode the watchdog proxies the check, in process it calls it."""
    ready_path = dockerfile_env(TEMPLATE / "Dockerfile")["ready_path"]
    (function_dir / "function" / "handler.py").write_text('raise RuntimeError("broken setting")\n')
    wd = watchdogs(serve_env(ready_path=ready_path), cwd=function_dir, wait=False)
    deadline = time.monotonic() + 30
    while (r := _get(f"{wd.url}/_/ready")) is None or r.status_code == 503:
        assert time.monotonic() < deadline, wd.output()
        time.sleep(0.1)
    assert r.status_code == 500 and "the handler failed to load: RuntimeError: broken setting" in r.text
    good = watchdogs(serve_env(ready_path=ready_path), cwd=_fresh_copy(function_dir))
    assert requests.get(f"{good.url}/_/ready", timeout=5).status_code == 200


def _get(url: str) -> requests.Response | None:
    try:
        return requests.get(url, timeout=5)
    except requests.ConnectionError:
        return None


def _fresh_copy(function_dir: Path) -> Path:
    ctx = function_dir.parent / f"{function_dir.name}-good"
    shutil.copytree(function_dir, ctx, ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "function" / "handler.py").write_text(textwrap.dedent(HANDLER))
    return ctx


def test_each_call_is_logged_as_of_watchdog_logs_it(watchdogs, function_dir, serve_env):
    """of-watchdog's line per call (executor/http_runner.go): method, request URI, the status
    with its text, the body's size as go-units' HumanSize, the time; `[call id]` with log_callid."""
    wd = watchdogs(serve_env(), cwd=function_dir)
    r = requests.post(f"{wd.url}/any?x=1", data=b"hi", timeout=10)
    assert r.status_code == 201
    line = f"POST /any?x=1 - 201 Created - ContentLength: {len(r.content)}B ("
    _wait_for(wd, line)
    assert re.search(re.escape(line) + r"\d+\.\d{4}s\)$", wd.output(), re.M), wd.output()
    assert "/_/ready" not in wd.output()  # the probes are not calls
    traced = watchdogs(serve_env(log_callid="true"), cwd=function_dir)
    requests.post(f"{traced.url}/t", headers={"X-Call-Id": "call-42"}, timeout=10)
    requests.get(f"{traced.url}/none", timeout=10)
    _wait_for(traced, "GET /none - 200 OK - ContentLength: 0B (")
    assert re.search(r"POST /t - 201 Created - ContentLength: \d+B \(\d+\.\d{4}s\) \[call-42\]", traced.output())
    assert re.search(r"GET /none - 200 OK - ContentLength: 0B \(\d+\.\d{4}s\) \[none\]", traced.output())


def _wait_for(wd: Watchdog, text: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in wd.output():
        assert time.monotonic() < deadline, wd.output()
        time.sleep(0.05)


def test_human_size_is_go_units():
    human_size = load("faas_gpu_watchdog_status", TEMPLATE / "faas_gpu_watchdog" / "status.py").human_size

    assert [human_size(n) for n in (0, 2, 999, 1000, 1234, 12345, 999_999, 1_500_000)] == [
        "0B", "2B", "999B", "1kB", "1.234kB", "12.35kB", "1000kB", "1.5MB",
    ]  # fmt: skip


def test_status_lines_carry_gos_reason_phrases(watchdogs, function_dir):
    """The watchdog is Go's server in OpenFaaS: `418 I'm a teapot`, `599 status code 599`, and its
    own `400 Bad Request` whatever went wrong (Python's tables say otherwise)."""
    (function_dir / "function" / "handler.py").write_text(
        "def handle(event, context):\n    return {'statusCode': int(event.path.strip('/')), 'body': 'x'}\n"
    )
    wd = watchdogs(inproc_env(), cwd=function_dir)
    conn = http.client.HTTPConnection("127.0.0.1", wd.port, timeout=10)
    for code, reason in ((401, "Unauthorized"), (418, "I'm a teapot"), (422, "Unprocessable Entity"),
                         (511, "Network Authentication Required"), (599, "status code 599")):  # fmt: skip
        conn.request("POST", f"/{code}", body=b"")
        r = conn.getresponse()
        r.read()
        assert (r.status, r.reason) == (code, reason)
    conn.close()
    with socket.create_connection(("127.0.0.1", wd.port), timeout=10) as sock:
        sock.sendall(b"POST /\r\n\r\n")
        assert sock.recv(65536).split(b"\r\n", 1)[0] == b"HTTP/1.1 400 Bad Request"


def test_run_healthcheck_flag(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, str(TEMPLATE / "fwatchdog.py"), "-run-healthcheck"]
    assert subprocess.run(cmd, env=env).returncode == 1
    (tmp_path / ".lock").touch()
    assert subprocess.run(cmd, env=env).returncode == 0


def test_sigterm_drains_inflight_then_exits_zero(watchdogs, function_dir, serve_env):
    (function_dir / "function" / "handler.py").write_text(
        "import time\ndef handle(event, context):\n    time.sleep(1.5)\n    return {'body': 'done'}\n"
    )
    wd = watchdogs(serve_env(write_timeout="10s"), cwd=function_dir)
    result = {}
    t = threading.Thread(target=lambda: result.update(r=requests.post(wd.url, timeout=20)))
    t.start()
    time.sleep(0.4)
    os.kill(wd.proc.pid, signal.SIGTERM)
    t.join()
    assert result["r"].status_code == 200 and result["r"].text == "done"
    assert wd.proc.wait(15) == 0
    assert not (wd.tmpdir / ".lock").exists()


def test_metrics_port(watchdogs, function_dir, serve_env):
    mport = free_port()
    wd = watchdogs(serve_env(metrics_port=str(mport)), cwd=function_dir)
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


SHAPES = """
import os, sys

def handle(event, context):
    kind = event.path.strip("/")
    if kind == "none":
        return None
    if kind == "str":
        return "plain text"
    if kind == "bytes":
        return b"\\x00raw"
    if kind == "json":
        return {"body": {"b": [1, "é"], "a": None}}
    if kind == "json-as-text":
        return {"body": {"a": 1}, "headers": {"Content-Type": "text/plain"}, "statusCode": 203}
    if kind == "octet":
        return {"body": b"\\x01\\x02", "headers": {"Content-type": "application/octet-stream"}}
    if kind == "number-body":
        return {"body": 42, "statusCode": 418}
    if kind == "no-body":
        return {"statusCode": 204}
    if kind == "tuple":
        return ("made", 202, {"X-T": "1"})
    if kind == "list":
        return [1, 2]
    if kind.startswith("event"):
        return {"body": {"path": event.path, "query": event.query.to_dict(flat=False),
                         "ct": event.headers.get("content-type"), "x": event.headers.get("X-Many"),
                         "absent": event.headers.get("X-Absent", "dflt"), "typed": event.headers.get("X-N", type=int),
                         "bad-type": event.headers.get("X-Many", -1, type=int), "list": event.headers.getlist("x-many"),
                         "in": "x-many" in event.headers, "item": event.headers["X-Many"],
                         "method": event.method, "body": event.body.decode()}}
    if kind == "print":
        print("to stdout", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        os.write(1, b"native write\\n")
        return "printed"
    raise ValueError(kind)
"""


def _answers(wd: Watchdog) -> list[tuple]:
    got = []
    for kind in ("none", "str", "bytes", "json", "json-as-text", "octet", "number-body", "no-body", "tuple", "list"):
        r = requests.post(f"{wd.url}/{kind}", timeout=10)
        got.append((kind, r.status_code, r.headers.get("Content-Type"), r.headers.get("X-T"), r.content))
    r = requests.put(
        f"{wd.url}/event%20x?q=1&q=2&e=",
        data="ü".encode(),
        headers={"Content-Type": "text/x-test", "X-Many": "one", "X-N": "7"},
        timeout=10,
    )
    got.append(("event", r.status_code, r.headers.get("Content-Type"), None, r.content))
    return got


def test_inproc_answers_every_handler_result_as_the_proxied_server_does(watchdogs, function_dir):
    """The template's two ways of serving give the same status, Content-Type and bytes for each
    shape a handler returns, and the same event for the same request."""
    (function_dir / "function" / "handler.py").write_text(SHAPES)
    proxied = _answers(watchdogs(http_env(), cwd=function_dir))
    in_process = _answers(watchdogs(inproc_env(), cwd=function_dir))
    assert in_process == proxied
    event = json.loads(in_process[-1][-1])
    assert event == {
        "path": "/event x",
        "query": {"q": ["1", "2"], "e": [""]},
        "ct": "text/x-test",
        "x": "one",
        "absent": "dflt",
        "typed": 7,
        "bad-type": -1,
        "list": ["one"],
        "in": True,
        "item": "one",
        "method": "PUT",
        "body": "ü",
    }


def test_inproc_logs_the_functions_output_prefixed_as_http_mode_does(watchdogs, function_dir):
    (function_dir / "function" / "handler.py").write_text(SHAPES)
    wd = watchdogs(inproc_env(), cwd=function_dir)
    assert requests.post(f"{wd.url}/print", timeout=10).text == "printed"
    plain = watchdogs(inproc_env(prefix_logs="false"), cwd=function_dir)
    assert requests.post(f"{plain.url}/print", timeout=10).text == "printed"
    deadline = time.monotonic() + 10
    while "native write" not in plain.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    out = wd.output()
    assert "stdout: to stdout" in out and "stderr: to stderr" in out and "stdout: native write" in out
    assert "Listening on port" in out and "stdout: " not in out.split("Listening on port")[0].splitlines()[-1]
    plain_out = plain.output()
    assert "to stdout" in plain_out and "stdout: to stdout" not in plain_out
    assert re.search(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d native write$", plain_out, re.M)


def test_inproc_timeout_answers_504_closes_and_drops_the_late_answer(watchdogs, function_dir):
    (function_dir / "function" / "handler.py").write_text(
        "import time\ndef handle(event, context):\n    time.sleep(float(event.body or 0))\n    return 'late'\n"
    )
    wd = watchdogs(inproc_env(exec_timeout="300ms"), cwd=function_dir)
    conn = http.client.HTTPConnection("127.0.0.1", wd.port, timeout=10)
    t0 = time.monotonic()
    conn.request("POST", "/", body=b"1.5")
    r = conn.getresponse()
    assert r.status == 504 and b"Timeout after" in r.read() and time.monotonic() - t0 < 1.2
    assert r.getheader("Connection") == "close" and r.getheader("X-Duration-Seconds")
    conn.close()
    time.sleep(1.5)  # the handler has returned meanwhile: its answer went nowhere
    assert requests.post(wd.url, data=b"0", timeout=10).text == "late"
    assert "late" not in wd.output()


@pytest.mark.parametrize(
    "handler_py, fprocess, message",
    [
        ("raise ImportError('no such model')\n", "python index.py", None),  # index.py serves that as 500
        (None, "python missing.py", "missing.py"),
        (None, "node index.js", "fprocess must be `python SCRIPT.py`"),
    ],
)
def test_inproc_scripts_that_cannot_serve(tmp_path, function_dir, handler_py, fprocess, message):
    if handler_py is not None:
        (function_dir / "function" / "handler.py").write_text(handler_py)
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "port": str(free_port()),
        "metrics_port": "0",
        "mode": "inproc",
        "fprocess": fprocess,
        "bind_address": "127.0.0.1",
    }
    proc = subprocess.Popen(
        [sys.executable, str(function_dir / "fwatchdog.py")],
        env=env,
        cwd=function_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if message is None:  # a handler that fails to import: every call says why, as in http mode
        url = f"http://127.0.0.1:{env['port']}"
        deadline = time.monotonic() + 30
        while True:
            try:
                r = requests.post(url, timeout=60)  # the first call waits for index.py to load
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        proc.kill()
        assert r.status_code == 500 and "no such model" in r.text
        return
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and message in out.decode()


def test_inproc_serves_a_wsgi_app_when_the_script_has_no_handle_http(watchdogs, tmp_path):
    ctx = tmp_path / "wsgi"
    ctx.mkdir()
    shutil.copy(TEMPLATE / "fwatchdog.py", ctx)
    shutil.copytree(
        TEMPLATE / "faas_gpu_watchdog", ctx / "faas_gpu_watchdog", ignore=shutil.ignore_patterns("__pycache__")
    )
    (ctx / "app.py").write_text(
        "def app(environ, start_response):\n"
        "    body = environ['wsgi.input'].read()\n"
        "    start_response('201 Created', [('Content-Type', 'text/plain'), ('X-Path', environ['PATH_INFO'])])\n"
        "    return [environ['REQUEST_METHOD'].encode(), b' ', body, b' ', environ.get('HTTP_X_A', '').encode()]\n"
    )
    wd = watchdogs({"mode": "inproc", "fprocess": "python3 app.py"}, cwd=ctx)
    r = requests.post(f"{wd.url}/a%2Fb", data=b"x", headers={"X-A": "1"}, timeout=10)
    assert r.status_code == 201 and r.text == "POST x 1" and r.headers["X-Path"] == "/a/b"


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"POST / HTTP/1.1\r\nHost: x\r\n folded: y\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nBad Name: y\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n", 431),
        (b"POST / HTTP/1.1\r\nX-Long: " + b"y" * 70000 + b"\r\n\r\n", 431),
        (b"POST / HTTP/2.0\r\n\r\n", 505),
        (b"POST / HTTX/1.1\r\n\r\n", 400),
        (b"POST /\r\n\r\n", 400),
    ],
)
def test_a_request_the_watchdog_cannot_read_gets_a_clear_4xx(watchdogs, raw, status):
    wd = watchdogs({"mode": "classic", "fprocess": "cat"})
    with socket.create_connection(("127.0.0.1", wd.port), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.") and int(answer.split(b" ", 2)[1]) == status, answer[:200]
    assert requests.post(wd.url, data=b"still serving", timeout=10).content == b"still serving"


def test_repeated_headers_and_keep_alive_reach_the_function(watchdogs, function_dir):
    (function_dir / "function" / "handler.py").write_text(SHAPES)
    wd = watchdogs(inproc_env(), cwd=function_dir)
    conn = http.client.HTTPConnection("127.0.0.1", wd.port, timeout=10)
    for _ in range(3):  # one connection, three calls
        conn.putrequest("POST", "/event")
        conn.putheader("X-Many", "first")
        conn.putheader("X-Many", "second")
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["x"] == "first"
    conn.close()


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
