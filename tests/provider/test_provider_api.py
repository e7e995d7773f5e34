"""The faas-provider API and gateway routes, over real HTTP against a real stack process.

Functions here are classic-watchdog deployments (envProcess only), so no build is needed.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from faas_gpu.ports import free_port
from provider.handlers.info import go_arch
from tests.stack_process import StackProcess

NS = "openfaas-fn"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # the callback receivers of these tests listen on loopback, which callbacks may reach only when allowed
    s = StackProcess(tmp_path_factory.mktemp("stack"), "--callback-allow", "127.0.0.1").start()
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


def test_gateway_metrics_also_on_their_own_port_as_ce_8082(stack, cat_fn):
    requests.post(f"{stack.url}/function/{cat_fn}", data=b"x", timeout=10)
    r = requests.get(f"{stack.metrics_url}/metrics", timeout=5)
    assert r.status_code == 200 and "gateway_function_invocation_total" in r.text
    assert f'function_name="{cat_fn}.{NS}"' in r.text
    r = requests.get(f"{stack.metrics_url}/healthz", timeout=5)
    assert (r.status_code, r.text) == (200, "OK")
    assert requests.post(f"{stack.metrics_url}/healthz", timeout=5).status_code == 405
    # only those two: neither the API nor the functions are reachable there
    assert requests.get(f"{stack.metrics_url}/system/functions", auth=stack.auth, timeout=5).status_code == 404
    assert requests.post(f"{stack.metrics_url}/function/{cat_fn}", data=b"x", timeout=5).status_code == 404


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
    assert isinstance(st["invocationCount"], int)  # a float64 Go writes without a fraction when whole
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
    # the certifier's Test_ProviderInfo: the gateway's own version and the provider's, each complete
    assert gw["version"]["release"] and gw["version"]["sha"] and gw["provider"]["version"]["release"]
    assert set(gw["version"]) == {"sha", "release"}  # commit_message is omitempty in Go, and empty here
    assert gw["arch"] == go_arch() and gw["arch"] in ("amd64", "arm64", "arm", "386", "ppc64le", "s390x", "riscv64")
    pv = requests.get(f"{stack.provider_url}/system/info", auth=stack.auth, timeout=5).json()
    assert pv["provider"] == "faas-gpu" and pv["orchestration"] == "local-process" and "sha" in pv["version"]
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
    # the provider API refuses 0 as faas-netes CE does ...
    r = requests.post(
        f"{stack.provider_url}/system/scale-function/scaled?namespace={NS}",
        json={"replicas": 0},
        auth=stack.auth,
        timeout=5,
    )
    assert r.status_code == 400 and r.text.startswith("replicas:")
    # ... the gateway makes it the minimum, as the CE gateway's scaling/ranges.go does
    r = requests.post(
        f"{stack.url}/system/scale-function/scaled?namespace={NS}",
        json={"replicas": 0},
        auth=stack.auth,
        timeout=5,
    )
    assert r.status_code == 202 and "scaled to 2" in r.text
    assert replicas(stack, "scaled") == 2


def replicas(stack, name):
    return requests.get(f"{stack.url}/system/function/{name}", auth=stack.auth, timeout=5).json()["replicas"]


def test_gateway_scale_without_a_max_label_stops_at_ce_5_the_provider_at_20(stack):
    assert deploy(stack, "unlabelled").status_code == 202
    for base, expected in ((stack.url, 5), (stack.provider_url, 20)):
        r = requests.post(f"{base}/system/scale-function/unlabelled", json={"replicas": 50}, auth=stack.auth, timeout=5)
        assert r.status_code == 202 and f"scaled to {expected}" in r.text
        assert replicas(stack, "unlabelled") == expected
    requests.post(f"{stack.url}/system/scale-function/unlabelled", json={"replicas": 1}, auth=stack.auth, timeout=5)
    assert replicas(stack, "unlabelled") == 1


@pytest.mark.slow
def test_plain_function_scales_up_under_throughput_and_back_as_the_certifier_checks(stack):
    """Test_ScaleUpAndDownFromThroughPut against the gateway: min 1, max 2, ~10 requests/s (the
    certifier's 2 workers at 5 QPS); the built-in alert rule must reach 2 within a minute, and
    return to 1 within a minute once the load stops."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    labels = {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "2"}
    assert deploy(stack, "throughput", labels=labels).status_code == 202
    stack.wait_ready("throughput")
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            t0 = time.monotonic()
            requests.post(f"{stack.url}/function/throughput", data=b"x", timeout=10)
            stop.wait(max(0.0, 0.2 - (time.monotonic() - t0)))  # 5 QPS each

    with ThreadPoolExecutor(2) as pool:
        for _ in range(2):
            pool.submit(worker)
        deadline, peak = time.monotonic() + 60, 1
        while time.monotonic() < deadline and peak < 2:
            peak = max(peak, replicas(stack, "throughput"))
            time.sleep(0.5)
        stop.set()
    assert peak == 2, "never reached com.openfaas.scale.max under load"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and replicas(stack, "throughput") != 1:
        time.sleep(0.5)
    assert replicas(stack, "throughput") == 1


def alert(stack, function_name, status, base=None):
    body = {
        "receiver": "scale-up",
        "status": status,
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "APIHighInvocationRate", "function_name": function_name, "code": "200"},
                "startsAt": "2024-01-01T00:00:00Z",
            }
        ],
    }
    return requests.post(f"{base or stack.url}/system/alert", json=body, auth=stack.auth, timeout=10)


def test_alertmanager_webhook_scales_a_plain_function_as_ce_does(stack):
    labels = {"com.openfaas.scale.max": "4", "com.openfaas.scale.factor": "50"}
    assert deploy(stack, "alerted", labels=labels).status_code == 202
    r = alert(stack, f"alerted.{NS}", "firing")
    assert (r.status_code, r.text) == (200, "")
    assert replicas(stack, "alerted") == 3  # 1 + ceil(4/100*50)
    assert alert(stack, "alerted", "firing").status_code == 200  # no namespace: the default one
    assert replicas(stack, "alerted") == 4  # held at com.openfaas.scale.max
    assert alert(stack, f"alerted.{NS}", "resolved").status_code == 200
    assert replicas(stack, "alerted") == 1  # back to com.openfaas.scale.min
    # an unknown function is skipped with 200, as CE does (AlertManager would only retry it)
    assert (alert(stack, f"no-such-fn.{NS}", "firing").status_code) == 200
    assert alert(stack, "Not A Name!", "firing").status_code == 200
    # behind basic auth like every /system route; the provider API has no alert route (CE's gateway only)
    assert requests.post(f"{stack.url}/system/alert", json={}, timeout=5).status_code == 401
    assert alert(stack, "alerted", "firing", base=stack.provider_url).status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body:"),
        ({"alerts": "firing"}, "alerts:"),
        ({"alerts": [7]}, "alerts[0]:"),
        ({"alerts": [{"status": 1}]}, "alerts[0].status:"),
        ({"alerts": [{"status": "firing", "labels": []}]}, "alerts[0].labels:"),
        ({"alerts": [{"status": "firing", "labels": {"function_name": 5}}]}, "alerts[0].labels.function_name:"),
        ({"status": ["firing"]}, "status:"),
    ],
)
def test_a_bad_alert_body_is_400_naming_the_field(stack, body, field):
    r = requests.post(f"{stack.url}/system/alert", json=body, auth=stack.auth, timeout=5)
    assert r.status_code == 400 and r.text.startswith(field), r.text


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


def test_invocation_count_and_replicas_are_written_as_go_writes_them(stack, cat_fn):
    """function_status.go: invocationCount is a float64, which Go's encoding/json writes `3` when
    whole; replicas and availableReplicas are uint64."""
    import re

    requests.post(f"{stack.url}/function/{cat_fn}", data=b"x", timeout=10)
    for path in ("/system/functions", f"/system/function/{cat_fn}"):
        raw = requests.get(f"{stack.url}{path}", auth=stack.auth, timeout=5).text
        counts = re.findall(r'"invocationCount":\s*([0-9.eE+-]+)', raw)
        assert counts and all(re.fullmatch(r"\d+", c) for c in counts), raw[:300]
        assert re.search(r'"availableReplicas":\s*\d+[,}]', raw) and re.search(r'"replicas":\s*\d+[,}]', raw)


def test_calls_through_the_provider_port_are_not_counted_again_as_the_gateways(stack, cat_fn):
    """Behind the CE gateway (which counts its calls in its own gateway_* metrics), calls reach
    the provider's port; faas-provider's proxy route exports nothing for them (serve.go), so ours
    must not count them in gateway_* again. The provider's own counts (invocationCount, the
    autoscaler's) still see them."""
    import re

    def started() -> float:
        text = requests.get(f"{stack.metrics_url}/metrics", timeout=5).text
        found = re.search(rf'gateway_function_invocation_started{{function_name="{cat_fn}.{NS}"}} (\S+)', text)
        return float(found[1]) if found else 0.0

    def count() -> int:
        return requests.get(f"{stack.url}/system/function/{cat_fn}", auth=stack.auth, timeout=5).json()[
            "invocationCount"
        ]

    before, calls = started(), count()
    for _ in range(3):
        assert requests.post(f"{stack.provider_url}/function/{cat_fn}.{NS}", data=b"x", timeout=10).status_code == 200
    assert started() == before and count() == calls + 3
    assert requests.post(f"{stack.url}/function/{cat_fn}", data=b"x", timeout=10).status_code == 200
    assert started() == before + 1  # the gateway's own calls still count


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


def test_logs_content_types_and_unknown_functions_as_ce_gateway_and_faas_provider(stack, cat_fn):
    params = {"name": cat_fn, "follow": "false", "tail": "1"}
    gw = requests.get(f"{stack.url}/system/logs", params=params, auth=stack.auth, timeout=10)
    pv = requests.get(f"{stack.provider_url}/system/logs", params=params, auth=stack.auth, timeout=10)
    assert gw.headers["Content-Type"] == "text/plain; charset=utf-8"  # what Go sniffs of the NDJSON
    assert pv.headers["Content-Type"] == "application/x-ndjson"  # faas-provider's logs/handler.go
    assert json.loads(gw.text.splitlines()[0])["name"] == cat_fn
    unknown = {"name": "no-such-fn", "follow": "false"}
    r = requests.get(f"{stack.url}/system/logs", params=unknown, auth=stack.auth, timeout=10)
    assert (r.status_code, r.content) == (501, b"")  # CE maps the provider's 404 to an empty 501
    r = requests.get(f"{stack.provider_url}/system/logs", params=unknown, auth=stack.auth, timeout=10)
    assert r.status_code == 404


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
    r = deploy(stack, "read-secret", envProcess="cat /var/openfaas/secrets/api-key", secrets=["api-key"])
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


STATUS_SERVER = """
import http.server, sys

class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(int(self.path.rsplit("/", 1)[1]), "Whatever The Function Says")
        self.send_header("Content-Length", "0")
        self.end_headers()

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


def test_a_functions_own_status_reaches_the_caller_with_gos_reason_phrase(stack):
    """The gateway writes the status line of a function's answer as Go's gateway does (`401
    Unauthorized`), from one table of Go's phrases, for every code (not `401 Unknown`)."""
    import http.client
    import sys

    upstream = free_port()
    env = {"mode": "http", "upstream_url": f"http://127.0.0.1:{upstream}"}
    # inline: the replica's sandbox has a /tmp of its own, where the test's files are not
    process = f"{sys.executable} -c {shlex.quote(STATUS_SERVER)} {upstream}"
    assert deploy(stack, "status-fn", envProcess=process, envVars=env).status_code == 202
    stack.wait_ready("status-fn")
    host, port = stack.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    for code, reason in ((401, "Unauthorized"), (418, "I'm a teapot"), (451, "Unavailable For Legal Reasons")):
        conn.request("GET", f"/function/status-fn/{code}")
        r = conn.getresponse()
        r.read()
        assert (r.status, r.reason) == (code, reason)
    conn.close()
    requests.delete(f"{stack.url}/system/functions", json={"functionName": "status-fn"}, auth=stack.auth, timeout=30)


def test_replica_answers_carry_one_date_and_one_server_header(stack):
    """An http-mode replica (the watchdog in front of its upstream) answers with one Date and one
    Server, and so does the gateway in front of it: gunicorn treats both as its own (hop-by-hop
    in gunicorn.util), so the gateway's replace the replica's instead of joining them."""
    import http.client
    import sys

    upstream = free_port()
    env = {"mode": "http", "upstream_url": f"http://127.0.0.1:{upstream}"}
    process = f"{sys.executable} -m http.server {upstream} --bind 127.0.0.1"  # sends its own Server and Date
    assert deploy(stack, "http-fn", envProcess=process, envVars=env).status_code == 202
    stack.wait_ready("http-fn")
    host, port = stack.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    for path in ("/function/http-fn/", "/function/no-such-fn"):
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        assert len(r.msg.get_all("Date")) == 1 and len(r.msg.get_all("Server")) == 1, (path, r.msg.items())
    conn.close()
    requests.delete(f"{stack.url}/system/functions", json={"functionName": "http-fn"}, auth=stack.auth, timeout=30)


def test_an_unbuilt_python3_gpu_function_is_refused_naming_the_store_and_the_build(stack):
    """faas-cli sends the template's fprocess; without the built image every call would be a 500."""
    r = deploy(stack, "gpu-fn", envProcess="python index.py")
    assert r.status_code == 400, r.text
    assert r.text.startswith("image:") and str(stack.home / "images") in r.text
    assert "index.py" in r.text and "faas-gpu build -f stack.yaml" in r.text and "--shrinkwrap" in r.text
    assert requests.get(f"{stack.url}/system/function/gpu-fn", auth=stack.auth, timeout=5).status_code == 404
    r = deploy(stack, "not-here", envProcess="no-such-program --x")
    assert r.status_code == 400 and str(stack.home / "images") in r.text
    assert deploy(stack, "inline-py", envProcess="python -c 'print(1)'").status_code == 202  # runs no file


def test_no_metrics_keeps_no_per_call_records(tmp_path):
    """`--no-metrics`: /metrics still answers (a scrape stays up, gateway_service_count is read at
    scrape time), without the per-call series; invocation counts (autoscaling's) still count."""
    s = StackProcess(tmp_path / "quiet", "--no-metrics").start()
    try:
        assert deploy(s, "quiet-fn").status_code == 202
        s.wait_ready("quiet-fn")
        assert requests.post(f"{s.url}/function/quiet-fn", data=b"x", timeout=10).content == b"x"
        status = requests.get(f"{s.url}/system/function/quiet-fn", auth=s.auth, timeout=5).json()
        assert status["invocationCount"] == 1
        for base in (s.url, s.metrics_url):
            r = requests.get(f"{base}/metrics", timeout=5)
            assert r.status_code == 200
            assert f'gateway_service_count{{function_name="quiet-fn.{NS}"}}' in r.text
            assert "quiet-fn" not in r.text.replace(f'gateway_service_count{{function_name="quiet-fn.{NS}"}}', "")
        ui = requests.get(f"{s.url}/ui/api/status", auth=s.auth, timeout=5).json()["functions"]
        assert ui["recording"] is False and ui["items"][0]["ratePerSecond"] == 0
    finally:
        s.stop()


def test_metrics_switch_from_the_environment():
    from faas_gpu.contract import env as env_vars
    from provider.config import ProviderConfig

    assert ProviderConfig.from_env({}).metrics is True
    assert ProviderConfig.from_env({"FAAS_GPU_METRICS": "off"}).metrics is False
    assert ProviderConfig.from_env({"FAAS_GPU_METRICS": "OFF"}, metrics=True).metrics is True  # a flag wins
    with pytest.raises(ValueError, match="on or off"):
        env_vars.METRICS.read({"FAAS_GPU_METRICS": "maybe"})
