"""One bad function never stalls the others: a record that cannot start, or replicas that
crash-loop, are that function's state (backed off, shown by describe, a prompt 503), while every
other function keeps starting and serving. Real stack processes over real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import requests

from faas_gpu.credentials import ensure_token
from faas_gpu.datastore import open_datastore
from tests.stack_process import StackProcess

NS = "openfaas-fn"
LONG_NAME = "a" + "b" * 299  # past NAME_MAX: every start raises ENAMETOOLONG
HUGE_ENV_PROCESS = "cat " + "x" * 3_000_000  # 3 MB: past Linux's MAX_ARG_STRLEN (exec: E2BIG)


def _deploy(s: StackProcess, name: str, **extra) -> requests.Response:
    body = {"service": name, "image": f"functions/{name}:latest", "envProcess": "cat", **extra}
    return requests.post(f"{s.url}/system/functions", json=body, auth=s.auth, timeout=10)


def _write_record(home, service: str, **deployment) -> None:
    """Straight into the datastore, as a record that got in before deploy-time validation."""
    ds = open_datastore(None, home / "state.db", cluster_token=ensure_token(home / "secrets"))  # the provider's seal
    try:
        dep = {"service": service, "image": f"functions/{service}:latest", **deployment}
        record = {"deployment": dep, "namespace": NS, "replicas": 1, "createdAt": "2026-01-01T00:00:00Z"}
        ds.put(f"/faas-gpu/functions/{NS}/{service}", json.dumps(record))
    finally:
        ds.close()


def _status(s: StackProcess, name: str) -> dict:
    r = requests.get(f"{s.url}/system/function/{name}", auth=s.auth, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _wait_state(s: StackProcess, name: str, state: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while time.monotonic() < deadline:
        status = _status(s, name)
        if (status.get("faasGpuStatus") or {}).get("state") == state:
            return status
        time.sleep(0.2)
    raise AssertionError(f"{name[:40]} never {state}: {status.get('faasGpuStatus')}")


def test_functions_that_cannot_start_never_stall_the_others_even_after_a_restart(tmp_path):
    home = tmp_path / "home"
    s = StackProcess(home).start()
    try:
        assert _deploy(s, "before").status_code == 202
        s.wait_ready("before")
    finally:
        s.stop()
    _write_record(home, LONG_NAME, envProcess="cat")
    _write_record(home, "huge-env", envProcess=HUGE_ENV_PROCESS)
    _write_record(home, "huge-env-vars", envProcess="cat", envVars={f"V{i}": "y" * 100_000 for i in range(40)})
    _write_record(home, "no-image")  # no image in the store and no envProcess: does not plan
    s.start()
    try:
        s.wait_ready("before", timeout_s=30)
        assert _deploy(s, "after").status_code == 202
        s.wait_ready("after", timeout_s=30)
        for name in ("before", "after"):
            assert requests.post(f"{s.url}/function/{name}", data=b"still here", timeout=10).content == b"still here"
        # records that today's deploy would refuse are quarantined: never started, not served
        names = [f["name"] for f in requests.get(f"{s.url}/system/functions", auth=s.auth, timeout=10).json()]
        assert sorted(names) == ["after", "before", "no-image"]
        for name in (LONG_NAME, "huge-env", "huge-env-vars"):
            t0 = time.monotonic()
            r = requests.post(f"{s.url}/function/{name}", data=b"x", timeout=30)
            assert r.status_code == 404 and time.monotonic() - t0 < 3, r.text
        # a valid record that cannot start is that function's own state, shown by describe
        assert "image" in _wait_state(s, "no-image", "StartFailed")["faasGpuStatus"]["message"]
        assert _status(s, "no-image")["availableReplicas"] == 0
        healthy = _status(s, "after")
        assert "faasGpuStatus" not in healthy and healthy["availableReplicas"] == 1
        t0 = time.monotonic()
        r = requests.post(f"{s.url}/function/no-image", data=b"x", timeout=30)
        assert r.status_code == 503 and time.monotonic() - t0 < 3, r.text
        # logged once per change of reason, not once per supervisor tick
        time.sleep(2)
        assert s.log_path.read_text().count("no-image.openfaas-fn cannot start") == 1
        # and the operator can remove what cannot start, quarantined or not
        for name in (LONG_NAME, "huge-env", "no-image"):
            r = requests.delete(f"{s.url}/system/functions", json={"functionName": name}, auth=s.auth, timeout=10)
            assert r.status_code == 202, r.text
            assert requests.get(f"{s.url}/system/function/{name}", auth=s.auth, timeout=10).status_code == 404
    finally:
        s.stop()


def test_a_crash_looping_function_answers_503_at_once_and_describe_says_so(tmp_path):
    s = StackProcess(tmp_path / "home").start()
    try:
        crash = "python3 -c 'import sys; print(\"boom at start\"); sys.exit(3)'"
        assert _deploy(s, "crasher", envProcess=crash, envVars={"mode": "http"}).status_code == 202
        assert _deploy(s, "fine").status_code == 202
        status = _wait_state(s, "crasher", "CrashLooping")
        assert status["availableReplicas"] == 0
        assert "faas-gpu logs crasher" in status["faasGpuStatus"]["message"]
        for _ in range(3):
            t0 = time.monotonic()
            r = requests.post(f"{s.url}/function/crasher", data=b"x", timeout=70)
            assert time.monotonic() - t0 < 2.0
            assert r.status_code == 503 and "crash-looping" in r.text and "/system/logs?name=crasher" in r.text
        s.wait_ready("fine")
        assert requests.post(f"{s.url}/function/fine", data=b"ok", timeout=10).content == b"ok"
        out = subprocess.run(
            [sys.executable, "-m", "faas_gpu.cli", "describe", "crasher", "--gateway", s.url],
            env={**os.environ, "FAAS_GPU_HOME": str(s.home), "OPENFAAS_CONFIG": str(tmp_path / "ofcfg")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        status_line = next(line for line in out.stdout.splitlines() if line.startswith("Status:"))
        assert "CrashLooping" in status_line and "faas-gpu logs crasher" in status_line, out.stdout + out.stderr
    finally:
        s.stop()
