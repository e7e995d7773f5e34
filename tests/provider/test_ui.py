"""The status page (`provider/ui/`): its JSON as aggregated from the provider, the datastore, the
scheduler and the procurer; its basic auth; and that names from elsewhere are shown as text.

The collector runs over fakes of the provider's parts and a real embedded datastore; the page is
checked in a real headless Chromium where one is installed (`tests/browser.py`)."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from flask import Flask
from werkzeug.serving import make_server

from faas_gpu.contract import keys
from faas_gpu.credentials import TOKEN_FILE
from faas_gpu.datastore import open_datastore
from provider.activity import Activity
from provider.auth import Credentials
from provider.config import ProviderConfig
from provider.types import FunctionDeployment, FunctionRecord
from provider.ui import STATIC, ui_blueprint
from provider.ui.status import StatusCollector
from tests.browser import chromium
from tests.stack_process import StackProcess

EVIL = "<script>window.__pwned = 1</script>"
EVIL_NODE = '<img src=x onerror="window.__pwned = 2">'
CREDS = Credentials("admin", "s3cret")
SCHED = "http://sched.test:9000"


class FakeStore:
    def __init__(self, records: list[FunctionRecord]):
        self.records = {r.key: r for r in records}

    def list(self) -> list[FunctionRecord]:
        return list(self.records.values())

    def cached(self, namespace: str, name: str) -> FunctionRecord | None:
        return self.records.get((namespace, name))


class FakeResponse:
    def __init__(self, body: object, status: int = 200):
        self.body, self.status_code = body, status

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise requests.HTTPError(f"{self.status_code}")

    def json(self) -> object:
        return self.body


class FakeSession:
    """The scheduler's /v1/status, by URL; an exception stands for a scheduler that is away."""

    def __init__(self, answers: dict[str, object]):
        self.answers, self.calls = answers, []

    def get(self, url: str, headers: dict, timeout: object) -> FakeResponse:
        self.calls.append((url, headers))
        answer = self.answers[url.removesuffix("/v1/status")]
        if isinstance(answer, Exception):
            raise answer
        return FakeResponse(answer)


def record(name: str, annotations: dict[str, str] | None = None, replicas: int = 1) -> FunctionRecord:
    """A record as the store holds it; built directly, so a name no deploy would accept can be tried."""
    return FunctionRecord(
        FunctionDeployment(service=name, image=f"fn/{name}:1", annotations=annotations), "openfaas-fn", replicas
    )


def scheduler_status(leader: bool = True) -> dict:
    return {
        "leader": leader,
        "leader_id": "sched-a",
        "queued": 3,
        "queues": {"strict": 1, "best-effort": 2, "units": {"node-1/cpu-0": 4}},
        "deadline_misses": 5,
        "late_dropped": 0,
        "distribution": "protean",
        "uploading": [{"function": "other.openfaas-fn", "bytes": 10, "total": 40, "s": 0.5, "state": "uploading"}],
        "models": [
            {
                "digest": "sha256:" + "ab" * 32,
                "function": "classify.openfaas-fn",
                "state": "loaded",
                "size": 1024,
                "unit": "node-1/cpu-0",
                "load_s": 1.5,
                "upload_s": 0.2,
            },
            "not a record",
        ],
        "reconfigurator": {
            "recent": [
                {"gpu": "node-1/0", "from": ["7g.80gb"], "to": ["4g.40gb", "3g.40gb"], "status": "done", "detail": ""},
                {
                    "gpu": "node-1/0",
                    "from": ["4g.40gb", "3g.40gb"],
                    "to": ["7g.80gb"],
                    "status": "failed",
                    "detail": "busy",
                },
            ]
        },
    }


@pytest.fixture
def cluster(tmp_path):
    """A provider's parts (fakes) over a real embedded datastore holding one GPU Manager's report."""
    home = tmp_path / "home"
    ds = open_datastore(None, home / "state.db")
    digest = "sha256:" + "ab" * 32
    ds.put(
        keys.unit("node-1", "cpu-0"),
        json.dumps(
            {
                "unit": "cpu-0",
                "node": "node-1",
                "kind": "cpu",
                "name": "cpu-0",
                "memory_mb": 64,
                "used_mb": 16,
                "state": "busy",
                "busy_for_s": 0.5,
                "models": [digest, "sha256:unknown"],
                "running": digest,
                "url": "http://mgr",
            }
        ),
    )
    ds.put(
        keys.unit(EVIL_NODE, "u1"),
        json.dumps({"unit": "u1", "node": EVIL_NODE, "kind": "gpu", "memory_mb": 10, "used_mb": 1, "models": [EVIL]}),
    )
    ds.put(keys.unit("node-2", "broken"), b"not json")
    ds.put(f"{keys.FN_MODELS}openfaas-fn/classify/{digest}", b"1")
    ds.put(f"{keys.CORDON}node-3", json.dumps({"reason": "spot eviction"}))
    ds.put(keys.SCHEDULER_LEADER, b"sched-a")
    ds.put(f"{keys.SCHEDULER_MEMBERS}sched-a", SCHED.encode())
    records = [record("classify", {"com.faas-gpu.slo-ms": "100"}), record(EVIL)]
    counts = {("openfaas-fn", "classify"): 7}
    activity = Activity()
    for seconds in (0.01, 0.02, 0.5):  # two within 100 ms, one over
        activity.record(("openfaas-fn", "classify"), 200, seconds, 100.0)
    provider = SimpleNamespace(
        config=ProviderConfig(home=home, scheduler_url=SCHED),
        datastore=ds,
        store=FakeStore(records),
        activity=activity,
        invoker=SimpleNamespace(counts=counts),
        status=lambda r: r.status(available=1, invocations=counts.get(r.key, 0)),
    )
    (home / "secrets").mkdir(parents=True)
    (home / "secrets" / TOKEN_FILE).write_text("cluster-token\n")
    yield provider
    ds.close()


# -- the JSON ----------------------------------------------------------------------------
def test_status_aggregates_functions_units_scheduler_and_procurement(cluster):
    (cluster.config.home / "procurement.json").write_text(
        json.dumps(
            {
                "updated": 1.0,
                "mode": "spot",
                "targetNodes": 2,
                "nodes": [{"id": "n1", "kind": "spot", "state": "ready"}],
                "cost": {"total": 0.25, "savings": 0.6},
                "events": [{"t": float(i), "event": "acquired", "node": f"n{i}", "kind": "spot"} for i in range(15)],
            }
        )
    )
    session = FakeSession({SCHED: scheduler_status()})
    s = StatusCollector(cluster, session=session).collect()

    fns = {f["name"]: f for f in s["functions"]["items"]}
    classify = fns["classify"]
    assert (classify["invocations"], classify["replicas"], classify["availableReplicas"]) == (7, 1, 1)
    assert classify["sloMs"] == 100.0 and classify["slo"] == {"met": 2, "missed": 1, "attainment": 0.6667}
    assert classify["ratePerSecond"] == pytest.approx(3 / 60)
    assert classify["invokeName"] == "classify" and classify["state"] == "Ready"
    assert fns[EVIL]["sloMs"] is None and fns[EVIL]["slo"]["attainment"] is None

    units = {u["key"]: u for u in s["units"]}
    assert set(units) == {"node-1/cpu-0", f"{EVIL_NODE}/u1"}  # the unreadable report is left out
    u = units["node-1/cpu-0"]
    assert (u["memoryMb"], u["usedMb"], u["state"], u["queued"]) == (64.0, 16.0, "busy", 4)
    assert u["models"][0]["functions"] == ["classify.openfaas-fn"] and u["models"][1]["functions"] == []
    assert u["running"]["functions"] == ["classify.openfaas-fn"]
    assert units[f"{EVIL_NODE}/u1"]["queued"] == 0 and units[f"{EVIL_NODE}/u1"]["models"][0]["digest"] == EVIL

    sched = s["scheduler"]
    assert sched["leaderId"] == "sched-a" and sched["members"] == [SCHED] and sched["answeredByLeader"]
    assert sched["queues"] == {"strict": 1.0, "bestEffort": 2.0} and sched["deadlineMisses"] == 5.0
    assert sched["uploading"] == [{"function": "other.openfaas-fn", "bytes": 10.0, "total": 40.0, "seconds": 0.5}]
    assert sched["models"] == [  # each model's cold start (the CLI's progress line reads it)
        {
            "digest": "sha256:" + "ab" * 32,
            "functions": ["classify.openfaas-fn"],
            "state": "loaded",
            "size": 1024.0,
            "unit": "node-1/cpu-0",
            "loadS": 1.5,
            "uploadS": 0.2,
        }
    ]
    assert session.calls == [(f"{SCHED}/v1/status", {"Authorization": "Bearer cluster-token"})]  # asked once
    assert [r["status"] for r in s["reconfigurations"]] == ["failed", "done"]  # newest first
    assert s["cordons"] == [{"node": "node-3", "reason": "spot eviction"}]

    p = s["procurement"]
    assert p["available"] and p["mode"] == "spot" and p["dollars"] == 0.25
    assert [e["node"] for e in p["events"]] == [f"n{i}" for i in range(14, 4, -1)]  # the last ten, newest first
    assert p["events"][0]["detail"] == "kind=spot"
    assert s["datastore"] == {"ok": True}


def test_a_function_idle_on_purpose_is_idle_not_red_not_ready(cluster):
    """Scaled to zero (0 replicas desired) is a state a function is put in, not a failure: the
    page says Idle in a neutral badge; Not Ready stays for replicas asked for that do not serve."""
    idle, starting, failed = record("idle", replicas=0), record("starting"), record("failed")
    cluster.store = FakeStore([idle, starting, failed])
    problems = {"failed": {"state": "StartFailed", "message": "the handler failed to load: boom"}}

    def status(r):
        out = r.status(available=0, invocations=0)
        if r.name in problems:
            out["faasGpuStatus"] = problems[r.name]
        return out

    cluster.status = status
    collected = StatusCollector(cluster, session=FakeSession({SCHED: scheduler_status()})).collect()
    fns = {f["name"]: f for f in collected["functions"]["items"]}
    assert fns["idle"]["state"] == "Idle" and fns["starting"]["state"] == "Not Ready"
    assert fns["failed"]["state"] == "StartFailed" and "boom" in fns["failed"]["message"]
    script = (STATIC / "ui.js").read_text()
    assert 'state === "Idle" ? "neutral"' in script and ".badge.neutral" in (STATIC / "ui.css").read_text()


def test_the_leader_is_asked_and_a_scheduler_away_or_no_token_only_empties_its_part(cluster):
    other = "http://sched-b.test:9000"
    cluster.config.scheduler_url = f"{other},{SCHED}"
    session = FakeSession({other: requests.ConnectionError("refused"), SCHED: scheduler_status(leader=True)})
    s = StatusCollector(cluster, session=session).collect()
    assert s["scheduler"]["url"] == SCHED and [c[0] for c in session.calls] == [
        f"{other}/v1/status",
        f"{SCHED}/v1/status",
    ]

    session = FakeSession({other: requests.ConnectionError("refused"), SCHED: requests.ConnectionError("refused")})
    s = StatusCollector(cluster, session=session).collect()
    assert "refused" in s["scheduler"]["error"] and s["scheduler"]["leaderId"] == "sched-a"
    assert all(u["queued"] is None for u in s["units"]) and s["units"] and s["reconfigurations"] == []

    (cluster.config.home / "secrets" / TOKEN_FILE).unlink()
    session = FakeSession({})
    s = StatusCollector(cluster, session=session).collect()
    assert "cluster token" in s["scheduler"]["error"] and session.calls == []
    assert not (cluster.config.home / "secrets" / TOKEN_FILE).exists()  # read where it is, never created
    assert s["procurement"] == {"available": False, "reason": "no procurer status file"}


def test_a_datastore_away_leaves_the_functions_the_provider_last_saw(cluster):
    cluster.datastore.close()
    cluster.store.list = lambda: (_ for _ in ()).throw(ConnectionError("etcd is away"))
    s = StatusCollector(cluster, session=FakeSession({SCHED: scheduler_status()})).collect()
    assert not s["datastore"]["ok"] and s["units"] == []
    assert "etcd is away" in s["functions"]["error"]
    assert [f["name"] for f in s["functions"]["items"]] == ["classify"]  # known from the invoker's counts


def test_collections_are_shared_by_pages_polling_together(cluster):
    t = [0.0]
    session = FakeSession({SCHED: scheduler_status()})
    collector = StatusCollector(cluster, session=session, clock=lambda: t[0], min_interval_s=1.0)
    first = collector()
    assert collector() is first and len(session.calls) == 1
    t[0] = 1.5
    assert collector() is not first and len(session.calls) == 2


# -- the routes: basic auth, headers ------------------------------------------------------
@pytest.fixture
def ui_app():
    app = Flask("ui-test")
    app.register_blueprint(ui_blueprint(lambda: {"functions": {"items": []}}, auth=True, check=CREDS.check))
    return app.test_client()


@pytest.mark.parametrize("path", ["/ui/", "/ui/api/status", "/ui/static/ui.js", "/ui/static/ui.css"])
def test_every_ui_route_needs_the_basic_auth_of_system_routes(ui_app, path):
    r = ui_app.get(path)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Basic realm="Restricted"'
    assert ui_app.get(path, headers={"Authorization": "Basic " + "YWRtaW46d3Jvbmc="}).status_code == 401
    r = ui_app.get(path, headers={"Authorization": CREDS.header()})
    assert r.status_code == 200
    assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    assert r.headers["X-Content-Type-Options"] == "nosniff"


def test_the_json_is_json_and_the_page_loads_only_its_own_files(ui_app):
    r = ui_app.get("/ui/api/status", headers={"Authorization": CREDS.header()})
    assert r.mimetype == "application/json" and r.get_json() == {"functions": {"items": []}}
    page = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert refs and all(not re.match(r"^[a-z]+:|^//", ref) for ref in refs), refs  # nothing from elsewhere


def test_auth_off_opens_the_page_as_it_opens_system_routes():
    app = Flask("ui-test")
    app.register_blueprint(ui_blueprint(dict, auth=False, check=CREDS.check))
    assert app.test_client().get("/ui/api/status").status_code == 200


def test_the_page_script_never_parses_text_as_markup():
    js = (STATIC / "ui.js").read_text()
    code = "\n".join(line for line in js.splitlines() if not line.lstrip().startswith("//"))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in code, sink
    assert "textContent" in code


def test_the_static_files_ship_with_the_package():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"provider.ui" = ["static/*"]' in pyproject
    assert {p.name for p in STATIC.iterdir()} >= {"index.html", "ui.js", "ui.css"}


# -- the stack: the route is on the gateway port, behind its auth --------------------------
def test_the_gateway_serves_the_page_and_counts_invocations(tmp_path):
    stack = StackProcess(tmp_path / "home").start()
    try:
        body = {
            "service": "cat-fn",
            "image": "functions/cat:latest",
            "envProcess": "cat",
            "annotations": {"com.faas-gpu.slo-ms": "5000"},
        }
        assert requests.post(f"{stack.url}/system/functions", json=body, auth=stack.auth, timeout=10).status_code == 202
        stack.wait_ready("cat-fn")
        for _ in range(3):
            assert requests.post(f"{stack.url}/function/cat-fn", data=b"x", timeout=10).status_code == 200
        r = requests.get(f"{stack.url}/ui/api/status", timeout=10)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Basic realm="Restricted"'
        s = requests.get(f"{stack.url}/ui/api/status", auth=stack.auth, timeout=10).json()
        (fn,) = s["functions"]["items"]
        assert (fn["name"], fn["invocations"], fn["slo"]["met"], fn["slo"]["attainment"]) == ("cat-fn", 3, 3, 1.0)
        assert s["scheduler"] == {"configured": False, "leaderId": None, "members": []}
        assert requests.get(f"{stack.url}/ui/", auth=stack.auth, timeout=10).status_code == 200
        assert requests.get(f"{stack.provider_url}/ui/", auth=stack.auth, timeout=10).status_code == 404  # gateway only
    finally:
        stack.stop()


# -- in a browser: names from elsewhere are text ------------------------------------------
@pytest.fixture
def served(cluster):
    """The ui blueprint over the collector and the fake cluster, on a real HTTP server."""
    app = Flask("ui-browser-test")
    collector = StatusCollector(cluster, session=FakeSession({SCHED: scheduler_status()}))
    app.register_blueprint(ui_blueprint(collector, auth=True, check=CREDS.check))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_function_named_script_is_shown_as_text_in_a_browser(served, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium(auth=(CREDS.user, CREDS.password)) as driver:
        driver.get(f"{served}/ui/")
        WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "updated").get_attribute("data-refreshes"))
        names = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#functions .fn-name")]
        assert EVIL in names and "classify" in names
        units = driver.find_element(By.ID, "units").text
        assert EVIL_NODE in units and "classify.openfaas-fn" in units
        assert driver.find_elements(By.CSS_SELECTOR, "#units code[title], #units li[title]")  # the digests
        # nothing of it became markup: no script or img was added, none of their code ran
        assert driver.find_elements(By.CSS_SELECTOR, "main script, main img") == []
        assert driver.execute_script("return window.__pwned === undefined")
        assert (
            driver.find_element(By.CSS_SELECTOR, '#units [data-unit="node-1/cpu-0"] meter').get_attribute("value")
            == "16"
        )
        driver.save_screenshot(str(tmp_path / "escaped.png"))


# -- the gateway's tally ------------------------------------------------------------------
def test_activity_counts_a_minute_of_calls_and_which_met_their_slo():
    t = [100.0]
    a = Activity(window_s=60, clock=lambda: t[0])
    key = ("openfaas-fn", "f")
    a.record(key, 200, 0.05, 100.0)  # met
    a.record(key, 200, 0.15, 100.0)  # too slow
    a.record(key, 504, 0.01, 100.0)  # a deadline missed is a miss however fast the answer
    a.record(key, 400, 0.01, 100.0)  # the handler's own 400, in time: met
    a.record(key, 200, 9.0, None)  # no SLO: counted in the rate only
    assert a.view(key) == {"ratePerSecond": round(5 / 60, 3), "slo": {"met": 2, "missed": 2}}
    t[0] += 61
    assert a.view(key) == {"ratePerSecond": 0.0, "slo": {"met": 2, "missed": 2}}  # tallies stay
    a.forget(key)
    assert a.view(key) == {"ratePerSecond": 0.0, "slo": {"met": 0, "missed": 0}}


def test_a_functions_slo_is_its_annotation_unless_its_calls_are_best_effort():
    assert record("f", {"com.faas-gpu.slo-ms": "250"}).deployment.slo_ms() == 250.0
    assert record("f").deployment.slo_ms() is None
    best_effort = {"com.faas-gpu.slo-ms": "250", "com.faas-gpu.class": "best-effort"}
    assert record("f", best_effort).deployment.slo_ms() is None
