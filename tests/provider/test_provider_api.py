"""The faas-provider API and gateway routes, over real HTTP against a real stack process.

Functions here are classic-watchdog deployments (envProcess only), so no build is needed.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.stack_process import StackProcess

NS = "openfaas-fn"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = StackProcess(tmp_path_factory.mktemp("stack")).start()
    yield s
    s.stop()


def deploy(stack, service, envProcess="cat", method="POST", **extra):  # noqa: N803
    body = {"service": service, "image": f"functions/{service}:latest", "envProcess": envProcess, **extra}
    return requests.request(method, f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=10)


@pytest.fixture(scope="module")
def cat_fn(stack):
    assert deploy(stack, "cat-fn", labels={"team": "a"}, annotations={"com.faas-gpu.slo-ms": "100"}).status_code == 202
    stack.wait_ready("cat-fn")
    return "cat-fn"


# -- auth --------------------------------------------------------------------------------
@pytest.mark.parametrize("port", ["url", "provider_url"])
def test_system_routes_need_basic_auth(stack, port):
    base = getattr(stack, port)
    r = requests.get(f"{base}/system/functions", timeout=5)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == 'Basic realm="Restricted"'
    assert "invalid credentials" in r.text
    r = requests.get(f"{base}/system/info", headers={"Authorization": "Bearer"}, timeout=5)
    assert r.status_code == 401
    r = requests.get(f"{base}/system/functions", auth=("admin", "wrong"), timeout=5)
    assert r.status_code == 401
    assert requests.get(f"{base}/system/functions", auth=stack.auth, timeout=5).status_code == 200


def test_healthz_and_metrics_are_open(stack):
    for base in (stack.url, stack.provider_url):
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        assert requests.head(f"{base}/healthz", timeout=5).status_code == 200
        assert requests.get(f"{base}/metrics", timeout=5).status_code == 200


def test_credentials_files_are_private(stack):
    for name in ("basic-auth-user", "basic-auth-password"):
        mode = stat.S_IMODE(os.stat(stack.home / "secrets" / name).st_mode)
        assert mode == 0o600


# -- deploy, status, list ----------------------------------------------------------------
def test_status_echoes_the_deployment(stack, cat_fn):
    st = requests.get(f"{stack.url}/system/function/{cat_fn}?namespace={NS}", auth=stack.auth, timeout=5).json()
    assert st["name"] == cat_fn and st["image"] == "functions/cat-fn:latest"
    assert st["namespace"] == NS and st["envProcess"] == "cat"
    assert st["labels"] == {"team": "a", "faas_function": cat_fn}
    assert st["annotations"] == {"com.faas-gpu.slo-ms": "100"}
    assert "envVars" not in st
    assert st["replicas"] == 1 and st["availableReplicas"] == 1
    assert isinstance(st["invocationCount"], float)
    assert st["createdAt"].endswith("Z")
    listed = requests.get(f"{stack.url}/system/functions", auth=stack.auth, timeout=5).json()
    assert cat_fn in [f["name"] for f in listed]


def test_limits_and_env_vars_verbatim(stack):
    limits = {"memory": "128Mi", "cpu": "500m"}
    assert (
        deploy(stack, "with-limits", limits=limits, requests={"memory": "64Mi"}, envVars={"A": "1"}).status_code == 202
    )
    st = requests.get(f"{stack.url}/system/function/with-limits", auth=stack.auth, timeout=5).json()
    assert st["limits"] == limits and st["requests"] == {"memory": "64Mi"} and st["envVars"] == {"A": "1"}


def test_namespaced_name_and_query(stack, cat_fn):
    for url in (f"/system/function/{cat_fn}.{NS}", f"/system/function/{cat_fn}?namespace={NS}"):
        assert requests.get(stack.url + url, auth=stack.auth, timeout=5).status_code == 200


def test_unknown_function_answers_404(stack):
    a = stack.auth
    assert requests.get(f"{stack.url}/system/function/nope", auth=a, timeout=5).status_code == 404
    assert deploy(stack, "nope", method="PUT").status_code == 404
    r = requests.delete(f"{stack.url}/system/functions", json={"functionName": "nope"}, auth=a, timeout=5)
    assert r.status_code == 404
    r = requests.post(f"{stack.url}/system/scale-function/nope", json={"replicas": 1}, auth=a, timeout=5)
    assert r.status_code == 404
    assert requests.post(f"{stack.url}/function/nope", data=b"x", timeout=5).status_code == 404


@pytest.mark.parametrize(
    "body, field",
    [
        ("{not json", "body"),
        ({"service": "Bad_Name", "image": "x"}, "service"),
        ({"image": "x"}, "service"),
        ({"service": "ok-name"}, "image"),
        ({"service": "ok-name", "image": "x", "envVars": {"A": 1}}, "envVars"),
        ({"service": "ok-name", "image": "x", "namespace": "other"}, "namespace"),
        ({"service": "ok-name", "image": "x", "labels": {"com.openfaas.scale.zero": "true"}}, "labels"),
        ({"service": "ok-name", "image": "no/such-image:1"}, "image"),
    ],
)
def test_bad_deployments_get_400_naming_the_field(stack, body, field):
    data = body if isinstance(body, str) else json.dumps(body)
    r = requests.post(f"{stack.url}/system/functions", data=data, auth=stack.auth, timeout=5)
    assert r.status_code == 400, r.text
    assert r.text.startswith(f"{field}:"), r.text


def test_unknown_namespace_is_refused(stack):
    r = requests.get(f"{stack.url}/system/functions?namespace=kube-system", auth=stack.auth, timeout=5)
    assert r.status_code == 400 and "namespace" in r.text


def test_chunked_deploy_body_is_accepted(stack):
    body = json.dumps({"service": "chunked", "image": "x", "envProcess": "cat"}).encode()
    r = requests.post(f"{stack.url}/system/functions", data=iter([body[:10], body[10:]]), auth=stack.auth, timeout=10)
    assert r.status_code == 202


def test_namespaces_and_info(stack):
    assert requests.get(f"{stack.url}/system/namespaces", auth=stack.auth, timeout=5).json() == [NS]
    gw = requests.get(f"{stack.url}/system/info", auth=stack.auth, timeout=5).json()
    assert gw["provider"]["provider"] == "faas-gpu" and set(gw) == {"provider", "version", "arch"}
    pv = requests.get(f"{stack.provider_url}/system/info", auth=stack.auth, timeout=5).json()
    assert pv["provider"] == "faas-gpu" and "orchestration" in pv and "sha" in pv["version"]
    r = requests.get(f"{stack.url}/system/namespace/{NS}", auth=stack.auth, timeout=5)
    assert r.status_code == 501


# -- scaling -----------------------------------------------------------------------------
def test_scale_min_max_labels(stack):
    labels = {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "3"}
    assert deploy(stack, "scaled", labels=labels).status_code == 202
    assert stack.wait_ready("scaled", replicas=2)["replicas"] == 2
    r = requests.post(
        f"{stack.url}/system/scale-function/scaled",
        json={"serviceName": "scaled", "replicas": 9},
        auth=stack.auth,
        timeout=5,
    )
    assert r.status_code == 202
    assert stack.wait_ready("scaled", replicas=3)["replicas"] == 3
    r = requests.post(
        f"{stack.url}/system/scale-function/scaled?namespace={NS}",
        json={"replicas": 0},
        auth=stack.auth,
        timeout=5,
    )
    assert r.status_code == 400 and r.text.startswith("replicas:")


# -- invoking ----------------------------------------------------------------------------
def test_invoke_classic_cat_echoes_and_sets_call_headers(stack, cat_fn):
    r = requests.post(f"{stack.url}/function/{cat_fn}", data=b"hello", timeout=10)
    assert r.status_code == 200 and r.content == b"hello"
    assert r.headers["X-Call-Id"] and r.headers["X-Start-Time"].isdigit()
    assert "X-Duration-Seconds" in r.headers
    r = requests.post(f"{stack.url}/function/{cat_fn}.{NS}/sub/path?x=1", data=b"ns", timeout=10)
    assert r.content == b"ns"
    assert requests.post(f"{stack.provider_url}/function/{cat_fn}", data=b"p", timeout=10).content == b"p"


def test_invoke_classic_env_sees_cgi_variables(stack):
    assert deploy(stack, "printenv", envProcess="env").status_code == 202
    stack.wait_ready("printenv")
    r = requests.post(f"{stack.url}/function/printenv/some/path?q=1", data=b"", headers={"X-Custom": "yes"}, timeout=10)
    env = dict(line.split("=", 1) for line in r.text.splitlines() if "=" in line)
    assert env["Http_Method"] == "POST" and env["Http_Query"] == "q=1"
    assert env["Http_Path"] == "/some/path" and env["Http_X_Custom"] == "yes"
    assert env["Http_X_Call_Id"]


def test_chunked_invocation_body(stack, cat_fn):
    r = requests.post(f"{stack.url}/function/{cat_fn}", data=iter([b"ab", b"cd"]), timeout=10)
    assert r.content == b"abcd"


def test_oversized_body_gets_413(tmp_path):
    s = StackProcess(tmp_path / "small", "--max-body-bytes", "1000").start()
    try:
        r = requests.post(f"{s.url}/function/anything", data=b"x" * 2000, timeout=10)
        assert r.status_code == 413 and "body" in r.text
        r = requests.post(f"{s.url}/function/anything", data=iter([b"x" * 800, b"x" * 800]), timeout=10)
        assert r.status_code == 413
    finally:
        s.stop()


def test_invocation_counts_and_metrics(stack, cat_fn):
    before = requests.get(f"{stack.url}/system/function/{cat_fn}", auth=stack.auth, timeout=5).json()
    requests.post(f"{stack.url}/function/{cat_fn}", data=b"x", timeout=10)
    after = requests.get(f"{stack.url}/system/function/{cat_fn}", auth=stack.auth, timeout=5).json()
    assert after["invocationCount"] == before["invocationCount"] + 1
    text = requests.get(f"{stack.url}/metrics", timeout=5).text
    assert f'gateway_function_invocation_total{{code="200",function_name="{cat_fn}.{NS}"}}' in text
    assert "gateway_functions_seconds_bucket" in text
    assert f'gateway_function_invocation_started{{function_name="{cat_fn}.{NS}"}} ' in text
    assert f'gateway_service_count{{function_name="{cat_fn}.{NS}"}}' in text
    q = requests.get(f"{stack.provider_url}/api/v1/query", params={"query": "sum(x)"}, timeout=5).json()
    assert q["status"] == "success" and q["data"]["resultType"] == "vector"
    assert any(v["metric"]["function_name"] == f"{cat_fn}.{NS}" for v in q["data"]["result"])
    assert "provider_http_requests_total" in requests.get(f"{stack.provider_url}/metrics", timeout=5).text


# -- logs --------------------------------------------------------------------------------
def test_logs_stream_ndjson_with_classic_lines(stack, cat_fn):
    requests.post(f"{stack.url}/function/{cat_fn}", data=b"12345", timeout=10)
    r = requests.get(
        f"{stack.url}/system/logs",
        params={"name": cat_fn, "namespace": NS, "follow": "false"},
        auth=stack.auth,
        timeout=10,
    )
    assert r.status_code == 200
    msgs = [json.loads(line) for line in r.text.splitlines()]
    assert {"name", "namespace", "instance", "timestamp", "text"} <= set(msgs[-1])
    texts = [m["text"] for m in msgs]
    assert any("Forking fprocess." in t for t in texts)
    assert any("Wrote 5 Bytes" in t for t in texts)
    r = requests.get(
        f"{stack.url}/system/logs",
        params={"name": cat_fn, "tail": "1", "follow": "false"},
        auth=stack.auth,
        timeout=10,
    )
    assert len(r.text.splitlines()) == 1
    r = requests.get(
        f"{stack.url}/system/logs", params={"name": cat_fn, "since": "not-a-time"}, auth=stack.auth, timeout=10
    )
    assert r.status_code == 422


def test_logs_follow_streams_new_lines(stack, cat_fn):
    with requests.get(
        f"{stack.url}/system/logs",
        params={"name": cat_fn, "follow": "true", "tail": "1"},
        auth=stack.auth,
        stream=True,
        timeout=20,
    ) as r:
        lines = r.iter_lines()
        next(lines)
        requests.post(f"{stack.url}/function/{cat_fn}", data=b"followme", timeout=10)
        seen = [json.loads(next(lines))["text"] for _ in range(2)]
        assert any("Forking fprocess." in t or "Wrote 8 Bytes" in t for t in seen)


# -- secrets -----------------------------------------------------------------------------
def test_secrets_lifecycle_and_delivery(stack):
    a, url = stack.auth, f"{stack.url}/system/secrets"
    assert requests.post(url, json={"name": "api-key", "value": "s3cr3t"}, auth=a, timeout=5).status_code == 202
    assert requests.post(url, json={"name": "api-key", "value": "x"}, auth=a, timeout=5).status_code == 409
    raw = base64.b64encode(b"v2").decode()
    assert requests.put(url, json={"name": "api-key", "rawValue": raw}, auth=a, timeout=5).status_code == 202
    assert requests.get(url, auth=a, timeout=5).json() == [{"name": "api-key", "namespace": NS}]
    path = stack.home / "function-secrets" / NS / "api-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"v2"
    r = deploy(stack, "read-secret", envProcess='sh -c "cat $secret_mount_path/api-key"', secrets=["api-key"])
    assert r.status_code == 202
    stack.wait_ready("read-secret")
    assert requests.post(f"{stack.url}/function/read-secret", data=b"", timeout=10).content == b"v2"
    assert requests.delete(url, json={"name": "api-key"}, auth=a, timeout=5).status_code == 202
    assert requests.delete(url, json={"name": "api-key"}, auth=a, timeout=5).status_code == 404
    r = requests.post(url, json={"name": "../etc", "value": "x"}, auth=a, timeout=5)
    assert r.status_code == 400 and r.text.startswith("name:")


def test_deploy_with_missing_secret_is_refused(stack):
    r = deploy(stack, "needs-secret", secrets=["absent"])
    assert r.status_code == 400 and "absent" in r.text


# -- async -------------------------------------------------------------------------------
class _Callbacks(BaseHTTPRequestHandler):
    received: list = []
    event = threading.Event()

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append((dict(self.headers), body))
        type(self).event.set()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_async_invocation_posts_result_to_callback(stack, cat_fn):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Callbacks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cb = f"http://127.0.0.1:{server.server_port}/cb"
        r = requests.post(
            f"{stack.url}/async-function/{cat_fn}", data=b"later", headers={"X-Callback-Url": cb}, timeout=5
        )
        assert r.status_code == 202 and r.headers["X-Call-Id"]
        assert _Callbacks.event.wait(20)
        headers, body = _Callbacks.received[-1]
        assert body == b"later"
        assert headers["X-Function-Status"] == "200" and headers["X-Function-Name"] == cat_fn
        assert headers["X-Call-Id"] == r.headers["X-Call-Id"] and float(headers["X-Duration-Seconds"]) >= 0
    finally:
        server.shutdown()
    bad = requests.post(
        f"{stack.url}/async-function/{cat_fn}", data=b"x", headers={"X-Callback-Url": "nope"}, timeout=5
    )
    assert bad.status_code == 400 and "X-Callback-Url" in bad.text
    assert requests.get(f"{stack.url}/async-function/{cat_fn}", timeout=5).status_code == 405


# -- delete ------------------------------------------------------------------------------
def test_delete_removes_function(stack):
    assert deploy(stack, "short-lived").status_code == 202
    stack.wait_ready("short-lived")
    assert requests.post(f"{stack.url}/function/short-lived", data=b"x", timeout=5).status_code == 200
    r = requests.delete(
        f"{stack.url}/system/functions",
        json={"functionName": "short-lived", "namespace": NS},
        auth=stack.auth,
        timeout=30,
    )
    assert r.status_code == 202
    assert requests.get(f"{stack.url}/system/function/short-lived", auth=stack.auth, timeout=5).status_code == 404
    assert requests.post(f"{stack.url}/function/short-lived", data=b"x", timeout=5).status_code == 404


def test_annotations_and_labels_are_always_objects_as_faasd_sends_them(stack):
    assert deploy(stack, "plain-fn").status_code == 202
    one = requests.get(f"{stack.url}/system/function/plain-fn", auth=stack.auth, timeout=10).json()
    assert one["annotations"] == {} and isinstance(one["labels"], dict)
    listed = requests.get(f"{stack.url}/system/functions", auth=stack.auth, timeout=10).json()
    assert all(isinstance(f["annotations"], dict) and isinstance(f["labels"], dict) for f in listed)


def test_status_lines_carry_gos_reason_phrases(stack):
    import http.client

    host, port = stack.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    body = json.dumps({"service": "status-line-fn", "image": "functions/x:latest", "envProcess": "cat"})
    auth = base64.b64encode(":".join(stack.auth).encode()).decode()
    conn.request("POST", "/system/functions", body, {"Authorization": f"Basic {auth}"})
    r = conn.getresponse()
    r.read()
    assert (r.status, r.reason) == (202, "Accepted")  # faas-cli prints this line verbatim
    conn.request("GET", "/system/function/no-such-fn", headers={"Authorization": f"Basic {auth}"})
    r = conn.getresponse()
    r.read()
    assert (r.status, r.reason) == (404, "Not Found")
    conn.close()
