"""Bad input on the HTTP surfaces gets a clear 4xx naming the field, never a 500 or a silent 202.

Real stack processes over real HTTP (classic-watchdog functions, no build needed).
"""

from __future__ import annotations

import base64
import json
import time

import pytest
import requests

from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from tests.harmony_models import VGG19
from tests.stack_process import StackProcess

NS = "openfaas-fn"
DEEP = ("[" * 100_000 + "]" * 100_000).encode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("bad-input")
    (home / "harmony-models.json").write_text(json.dumps({"VGG19": VGG19}))  # for a function with apps
    s = StackProcess(home).start()
    yield s
    s.stop()


def deploy(stack, service: str = "ok-fn", method: str = "POST", **extra) -> requests.Response:
    body = {"service": service, "image": f"functions/{service}:latest", "envProcess": "cat", **extra}
    return requests.request(method, f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=30)


@pytest.fixture(scope="module")
def cat_fn(stack):
    labels = {"com.openfaas.scale.max": "2"}
    assert deploy(stack, "cat-fn", labels=labels).status_code == 202
    stack.wait_ready("cat-fn")
    return "cat-fn"


def assert_400(r: requests.Response, field: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.text.startswith(field), r.text[:300]


# -- deploy-time validation ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"service": "a" * 300}, "service:"),
        ({"envProcess": "x" * (3 * 1024 * 1024)}, "envProcess:"),
        ({"annotations": {"com.faas-gpu.slo-ms": "abc"}}, "annotations: com.faas-gpu.slo-ms"),
        ({"annotations": {"com.faas-gpu.slo-ms": "-5"}}, "annotations: com.faas-gpu.slo-ms"),
        ({"annotations": {"com.faas-gpu.slo-ms": "NaN"}}, "annotations: com.faas-gpu.slo-ms"),
        ({"annotations": {"com.faas-gpu.slo-ms": "20O"}}, "annotations: com.faas-gpu.slo-ms"),
        ({"annotations": {"com.faas-gpu.slo-ms": "inf"}}, "annotations: com.faas-gpu.slo-ms"),
        ({"annotations": {"com.faas-gpu.max-batch": "many"}}, "annotations: com.faas-gpu.max-batch"),
        ({"labels": {"com.openfaas.scale.max": "1000000000"}}, "labels: com.openfaas.scale.max"),
        ({"limits": {"memory": "lots"}}, "limits.memory"),
        ({"requests": {"cpu": "fast"}}, "requests.cpu"),
        ({"secrets": ["s" * 300]}, "secrets:"),
        ({"envVars": {"FAAS_GPU_MAX_BATCH": "0"}}, "envVars.FAAS_GPU_MAX_BATCH"),
        ({"envVars": {"exec_timeout": "99999999999h"}}, "envVars.exec_timeout"),  # issue 41: an OverflowError a call
        ({"envVars": {"read_timeout": "1e3s"}}, "envVars.read_timeout"),
        ({"envVars": {"max_inflight": "lots"}}, "envVars.max_inflight"),
    ],
)
def test_bad_deploy_is_400_naming_the_field_and_nothing_is_stored(stack, extra, field):
    service = extra.get("service", "never-stored")
    for method in ("POST", "PUT"):
        assert_400(deploy(stack, method=method, **extra), field)
    listed = requests.get(f"{stack.url}/system/functions", auth=stack.auth, timeout=5).json()
    assert service not in [f["name"] for f in listed]


def test_a_bad_deploy_does_not_stop_later_functions(stack):
    assert deploy(stack, "a" * 300).status_code == 400
    assert deploy(stack, "big-env", envProcess="x" * (3 * 1024 * 1024)).status_code == 400
    assert deploy(stack, "after-bad").status_code == 202
    stack.wait_ready("after-bad", timeout_s=30)
    r = requests.post(f"{stack.url}/function/after-bad", data=b"still serving", timeout=10)
    assert r.status_code == 200 and r.content == b"still serving"


def test_scale_above_the_maximum_is_clamped_and_the_answer_says_so(stack, cat_fn):
    r = requests.post(
        f"{stack.url}/system/scale-function/{cat_fn}", json={"replicas": 10**9}, auth=stack.auth, timeout=5
    )
    assert r.status_code == 202
    assert "com.openfaas.scale.max (2)" in r.text and "scaled to 2" in r.text
    status = requests.get(f"{stack.url}/system/function/{cat_fn}", auth=stack.auth, timeout=5).json()
    assert status["replicas"] == 2
    r = requests.post(f"{stack.url}/system/scale-function/{cat_fn}", json={"replicas": 1}, auth=stack.auth, timeout=5)
    assert r.status_code == 202 and r.text == ""


# -- the JSON parser, the auth check, secrets -------------------------------------------------
@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("POST", "/system/functions"),
        ("PUT", "/system/functions"),
        ("DELETE", "/system/functions"),
        ("POST", "/system/secrets"),
        ("PUT", "/system/secrets"),
        ("POST", "/system/scale-function/cat-fn"),
    ],
)
def test_json_nested_100000_deep_is_400(stack, method, route):
    r = requests.request(method, stack.url + route, data=DEEP, auth=stack.auth, timeout=30)
    assert_400(r, "body:")
    assert "nested too deeply" in r.text


@pytest.mark.parametrize("port", ["url", "provider_url"])
@pytest.mark.parametrize("tail", ["99999999999999999999", "ten"])
def test_logs_tail_beyond_a_whole_number_is_422_naming_tail(stack, cat_fn, port, tail):
    r = requests.get(
        f"{getattr(stack, port)}/system/logs", params={"name": cat_fn, "tail": tail}, auth=stack.auth, timeout=10
    )
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert "tail:" in r.text


def test_a_watchdog_timeout_of_years_is_served_not_overflowed(stack):
    """Go's largest durations are accepted (as OpenFaaS does) and waited as the longest a poll can."""
    years = {"exec_timeout": "2000000h", "write_timeout": "2000000h"}
    assert deploy(stack, "years-fn", envVars=years).status_code == 202
    stack.wait_ready("years-fn", timeout_s=30)
    r = requests.post(f"{stack.url}/function/years-fn", data=b"still here", timeout=10)
    assert (r.status_code, r.content) == (200, b"still here")


@pytest.mark.parametrize("port", ["url", "provider_url"])
@pytest.mark.parametrize(
    "header",
    [
        "Basic " + base64.b64encode("admin:pässwörd".encode()).decode(),
        "Basic " + base64.b64encode("ädmin:x".encode()).decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(),
        "Basic ä",
    ],
)
def test_non_ascii_basic_auth_is_401(stack, port, header):
    r = requests.get(
        f"{getattr(stack, port)}/system/functions", headers={"Authorization": header.encode("utf-8")}, timeout=5
    )
    assert r.status_code == 401, (r.status_code, r.text[:200])


def test_secret_name_of_300_characters_is_400(stack):
    for method in ("POST", "PUT", "DELETE"):
        r = requests.request(
            method, f"{stack.url}/system/secrets", json={"name": "s" * 300, "value": "v"}, auth=stack.auth, timeout=5
        )
        assert_400(r, "name:")


# -- invocation headers ------------------------------------------------------------------------
def test_slo_header_of_1e23_is_400(stack, cat_fn):
    r = requests.post(f"{stack.url}/function/{cat_fn}", data=b"x", headers={"X-Faas-Gpu-Slo-Ms": "1e23"}, timeout=5)
    assert_400(r, "X-Faas-Gpu-Slo-Ms:")


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"X-Faas-Gpu-Class": "urgent"}, "X-Faas-Gpu-Class:"),
        ({"X-Faas-Gpu-Slo-Ms": "abc"}, "X-Faas-Gpu-Slo-Ms:"),
        ({"X-Faas-Gpu-Slo-Ms": "1e23"}, "X-Faas-Gpu-Slo-Ms:"),
    ],
)
def test_async_class_headers_are_checked_before_the_202(stack, cat_fn, headers, field):
    t0 = time.monotonic()
    r = requests.post(f"{stack.url}/async-function/{cat_fn}", data=b"x", headers=headers, timeout=5)
    assert_400(r, field)
    assert time.monotonic() - t0 < 2


def test_async_app_header_naming_no_app_is_400(stack):
    apps = {"com.faas-gpu.apps": "search=500,feed=800", "com.faas-gpu.harmony-model": "VGG19"}
    r = deploy(stack, "with-apps", annotations=apps)
    assert r.status_code == 202, r.text
    r = requests.post(f"{stack.url}/async-function/with-apps", data=b"x", headers={"X-Faas-Gpu-App": "nope"}, timeout=5)
    assert_400(r, "X-Faas-Gpu-App:")
    r = requests.post(f"{stack.url}/async-function/with-apps", data=b"x", headers={"X-Faas-Gpu-App": "feed"}, timeout=5)
    assert r.status_code == 202


# -- records stored by an older, laxer provider ------------------------------------------------
def test_bad_records_stored_before_do_not_stop_the_stack(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ds = open_datastore(None, home / "state.db", cluster_token=ensure_token(home / "secrets"))  # the provider's seal

    def record(service: str, **extra) -> str:
        deployment = {"service": service, "image": f"functions/{service}:latest", "envProcess": "cat", **extra}
        return json.dumps(
            {"deployment": deployment, "namespace": NS, "replicas": 1, "createdAt": "2026-01-01T00:00:00Z"}
        )

    ds.put(f"/faas-gpu/functions/{NS}/{'a' * 300}", record("a" * 300))
    ds.put(f"/faas-gpu/functions/{NS}/big-env", record("big-env", envProcess="x" * (3 * 1024 * 1024)))
    ds.put(f"/faas-gpu/functions/{NS}/bad-slo", record("bad-slo", annotations={"com.faas-gpu.slo-ms": "abc"}))
    ds.put(f"/faas-gpu/functions/{NS}/not-json", "{")
    ds.put(f"/faas-gpu/functions/{NS}/good", record("good"))
    ds.close()
    s = StackProcess(home).start()
    try:
        s.wait_ready("good", timeout_s=30)
        names = [f["name"] for f in requests.get(f"{s.url}/system/functions", auth=s.auth, timeout=5).json()]
        assert names == ["good"]
        assert requests.post(f"{s.url}/function/good", data=b"ok", timeout=10).content == b"ok"
        assert requests.get(f"{s.url}/system/function/bad-slo", auth=s.auth, timeout=5).status_code == 404
        # the bad record can be replaced by a good deploy, and removed
        assert deploy(s, "bad-slo").status_code == 202
        s.wait_ready("bad-slo", timeout_s=30)
        r = requests.delete(f"{s.url}/system/functions", json={"functionName": "big-env"}, auth=s.auth, timeout=5)
        assert r.status_code == 202
        assert "skipping the stored function" in s.log_path.read_text()
    finally:
        s.stop()
