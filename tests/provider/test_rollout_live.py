"""Ready means ready, and rollouts are gated on it: a real stack (local runtime), a python3-gpu
function built into its image store, real replicas over real HTTP, the real CLI (in process).

- A handler that raises at import is StartFailed, not Ready: in /system/function/NAME,
  /system/functions, /ui/'s status and `faas-gpu describe`; its calls are answered 503 at once.
- A broken version deployed over three good replicas under load takes no call: the old replicas
  serve on, describe says the rollout stalled and why, and `faas-gpu rollback` (or the previous
  spec deployed again) restores it at once; also when the image was rebuilt under the same tag.
"""

from __future__ import annotations

import io
import threading
import time
from contextlib import redirect_stdout

import pytest
import requests

from faas_gpu import cli
from faas_gpu.build import build
from faas_gpu.imagestore import ImageStore
from faas_gpu.stack import load_stack
from tests.stack_process import StackProcess

pytestmark = pytest.mark.slow

HANDLER = """\
import os

if os.environ.get("BROKEN"):
    raise RuntimeError("broken setting: BROKEN=" + os.environ["BROKEN"])


def handle(event, context):
    return "v" + os.environ.get("VERSION", "0")
"""
BROKEN_AT_IMPORT = 'raise ImportError("no module named the_model_i_forgot")\n'
STACK = (
    "version: 1.0\nprovider: {name: openfaas}\nfunctions:\n  NAME: {lang: python3-gpu, handler: ./fn, image: NAME}\n"
)


def _build(project, name: str, handler: str, home) -> None:
    (project / "fn").mkdir(parents=True, exist_ok=True)
    (project / "fn" / "handler.py").write_text(handler)
    (project / "stack.yml").write_text(STACK.replace("NAME", name))
    spec = load_stack(project / "stack.yml").functions[name]
    build(spec, ImageStore(home / "images"), stack_dir=project)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("rollout") / "home"
    s = StackProcess(home).start()
    project = home.parent / "project"
    _build(project, "rolling", HANDLER, home)
    _build(project, "broken", BROKEN_AT_IMPORT, home)
    yield s
    s.stop()


def _put(s: StackProcess, body: dict, method: str = "PUT") -> None:
    r = s.request(method, "/system/functions", json=body, timeout=30)
    assert r.status_code == 202, r.text


def _status(s: StackProcess, name: str) -> dict:
    r = s.request("GET", f"/system/function/{name}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _until(what: str, check, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"never {what}")


def _cli(s: StackProcess, monkeypatch, *argv: str) -> tuple[int, str]:
    monkeypatch.setenv("FAAS_GPU_HOME", str(s.home))
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main([*argv, "--gateway", s.url])
    return code, out.getvalue()


def test_a_handler_that_raises_at_import_is_start_failed_not_ready(stack, monkeypatch):
    _put(stack, {"service": "broken", "image": "broken:latest"}, "POST")

    def start_failed():
        status = _status(stack, "broken")
        return status if status.get("faasGpuStatus", {}).get("state") == "StartFailed" else None

    failed = _until("StartFailed", start_failed)
    assert failed["availableReplicas"] == 0 and "the_model_i_forgot" in failed["faasGpuStatus"]["message"]
    listed = {f["name"]: f for f in stack.request("GET", "/system/functions").json()}["broken"]
    assert listed["faasGpuStatus"]["state"] == "StartFailed" and listed["availableReplicas"] == 0
    ui = {f["name"]: f for f in stack.request("GET", "/ui/api/status").json()["functions"]["items"]}["broken"]
    assert ui["state"] == "StartFailed" and "the_model_i_forgot" in ui["message"]
    code, out = _cli(stack, monkeypatch, "describe", "broken")
    status_line = next(line for line in out.splitlines() if line.startswith("Status:"))
    assert code == 0 and "StartFailed" in status_line and "the_model_i_forgot" in status_line, out
    t0 = time.monotonic()
    r = requests.post(f"{stack.url}/function/broken", data=b"x", timeout=60)
    assert r.status_code == 503 and "the_model_i_forgot" in r.text and time.monotonic() - t0 < 5, r.text
    assert "ImportError" in "".join(m["text"] for m in _logs(stack, "broken"))


def _logs(s: StackProcess, name: str) -> list[dict]:
    import json

    r = s.request("GET", "/system/logs", params={"name": name, "follow": "false"}, timeout=10)
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


class Load:
    """Calls in a loop from two threads; every answer that is not 200 is kept."""

    def __init__(self, url: str):
        self.url, self.ok, self.failed = url, 0, []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        session = requests.Session()
        while not self.stop.is_set():
            try:
                r = session.post(self.url, data=b"x", timeout=60)
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append((r.status_code, r.text[:200]))
            except requests.RequestException as exc:
                self.failed.append(("error", str(exc)[:200]))

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70)


def _stalled(s: StackProcess, name: str):
    st = _status(s, name)
    rollout = st.get("faasGpuRollout") or {}
    return st if rollout.get("state") == "Stalled" else None


def _settled(s: StackProcess, name: str, replicas: int):
    st = _status(s, name)
    return st if "faasGpuRollout" not in st and st["availableReplicas"] == replicas else None


def _instances(s: StackProcess, name: str) -> set[str]:
    r = s.request("GET", f"/system/function/{name}/instances", timeout=10)
    return {i["id"] for i in r.json()["instances"]}


def test_a_broken_version_over_three_good_replicas_under_load_fails_no_call_and_rollback_restores_it(
    stack, monkeypatch, tmp_path
):
    # min = max = 3: the load below would otherwise scale it up (CE's alert rule), which is not this test's
    labels = {"com.openfaas.scale.min": "3", "com.openfaas.scale.max": "3"}
    good = {"service": "rolling", "image": "rolling:latest", "labels": labels}
    _put(stack, {**good, "envVars": {"VERSION": "1"}}, "POST")
    stack.wait_ready("rolling", replicas=3, timeout_s=180)
    serving = _instances(stack, "rolling")
    load = Load(f"{stack.url}/function/rolling")
    try:
        # 1. a broken setting: the rollout stalls, the old replicas serve on
        _put(stack, {**good, "envVars": {"VERSION": "2", "BROKEN": "yes"}})
        stalled = _until("a stalled rollout", lambda: _stalled(stack, "rolling"))
        message = stalled["faasGpuRollout"]["message"]
        assert "broken setting: BROKEN=yes" in message and "faas-gpu rollback rolling" in message, message
        assert stalled["availableReplicas"] == 3 and "faasGpuStatus" not in stalled
        code, out = _cli(stack, monkeypatch, "describe", "rolling")
        rollout_line = next(line for line in out.splitlines() if line.startswith("Rollout:"))
        assert "Stalled" in rollout_line and "broken setting" in rollout_line, out
        assert stalled["faasGpuPrevious"]["envVars"] == {"VERSION": "1"}
        # `faas-gpu rollback`: the old replicas are the current version again, the new ones go
        code, out = _cli(stack, monkeypatch, "rollback", "rolling")
        assert code == 0 and "Rolled back rolling" in out, out
        settled = _until("back to the old version", lambda: _settled(stack, "rolling", 3), 15)
        assert settled["envVars"] == {"VERSION": "1"} and _instances(stack, "rolling") == serving
        # 2. the same, undone by deploying the previous spec again
        _put(stack, {**good, "envVars": {"VERSION": "3", "BROKEN": "again"}})
        _until("a stalled rollout", lambda: _stalled(stack, "rolling"))
        _put(stack, {**good, "envVars": {"VERSION": "1"}})
        _until("back to the old version", lambda: _settled(stack, "rolling", 3), 15)
        assert _instances(stack, "rolling") == serving
        # 3. the image rebuilt under the same tag with a handler that cannot load, deployed with a
        # new setting: rollback returns to the replicas of the old build, which still run
        _build(tmp_path / "project", "rolling", BROKEN_AT_IMPORT, stack.home)
        _put(stack, {**good, "envVars": {"VERSION": "4"}})
        stalled = _until("a stalled rollout", lambda: _stalled(stack, "rolling"))
        assert "the_model_i_forgot" in stalled["faasGpuRollout"]["message"]
        code, out = _cli(stack, monkeypatch, "rollback", "rolling")
        assert code == 0, out
        _until("back to the old version", lambda: _settled(stack, "rolling", 3), 15)
        assert _instances(stack, "rolling") == serving
        time.sleep(1)
    finally:
        load.end()
    assert load.failed == [] and load.ok > 0, load.failed[:5]
    assert requests.post(f"{stack.url}/function/rolling", timeout=30).text == "v1"
    # nothing left to roll back to: the broken versions never served
    code, _ = _cli(stack, monkeypatch, "rollback", "rolling")
    assert code == 1
