"""The python3-gpu GPU client against a real scheduler and GPU Manager (cpu back end)."""

from __future__ import annotations

import io
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from faas_gpu import client
from faas_gpu.paths import REPO_ROOT
from tests.daemon_process import wait_units

sys.path.insert(0, str(REPO_ROOT / "functions" / "classify"))
from model import ResNetMini  # noqa: E402

from tests.torchscript import save_torchscript


@pytest.fixture
def remote_env(cluster, monkeypatch, tmp_path):
    start, auth = cluster
    start("gpu_manager", "--node", "n1", "--units", "2", "--unit-memory-mb", "8")
    sched = start("scheduler")
    wait_units(sched.url, auth, 2)
    monkeypatch.setenv("FAAS_GPU_SCHEDULER_URL", sched.url)
    token = tmp_path / "token"  # as the runtimes give it: a file in the replica, not its env
    token.write_text(auth["Authorization"][7:] + "\n")
    monkeypatch.setenv("FAAS_GPU_TOKEN_FILE", str(token))
    monkeypatch.delenv("FAAS_GPU_TOKEN", raising=False)
    monkeypatch.setenv("FAAS_GPU_MAX_BATCH", "8")
    monkeypatch.setenv("FAAS_GPU_BATCH_TIMEOUT_MS", "50")
    yield sched
    client.uninstall()


def test_the_token_is_read_from_its_file_else_from_the_env(tmp_path):
    (tmp_path / "token").write_text("from-the-file\n")
    url = {"FAAS_GPU_SCHEDULER_URL": "http://127.0.0.1:9"}
    both = {**url, "FAAS_GPU_TOKEN_FILE": str(tmp_path / "token"), "FAAS_GPU_TOKEN": "from-the-env"}
    assert client.ClientConfig.from_env(both).token == "from-the-file"
    assert client.ClientConfig.from_env({**url, "FAAS_GPU_TOKEN": "from-the-env"}).token == "from-the-env"
    with pytest.raises(RuntimeError, match="FAAS_GPU_TOKEN_FILE: cannot read the function's token"):
        client.ClientConfig.from_env({**url, "FAAS_GPU_TOKEN_FILE": str(tmp_path / "absent")})


def _old_torchscript(module: torch.nn.Module, path) -> None:
    """An old TorchScript artifact, as a user has one (the deprecated calls are the user's, long ago)."""
    save_torchscript(module, path)


def test_jit_load_returns_a_remote_model_with_the_same_answers(remote_env, tmp_path, caplog):
    """TorchScript still runs; torch's deprecation is said once in the log, not warned on each load."""
    import warnings

    torch.manual_seed(0)
    local = ResNetMini().eval()
    _old_torchscript(local, tmp_path / "model.pt")
    assert client.install()
    with warnings.catch_warnings(), caplog.at_level("WARNING"):
        warnings.simplefilter("error", DeprecationWarning)
        model = torch.jit.load(str(tmp_path / "model.pt"))
        torch.jit.load(str(tmp_path / "model.pt"))
    assert caplog.text.count("TorchScript, which torch deprecates") <= 1  # once a process
    assert isinstance(model, client.RemoteModel)
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(model(x), local(x), atol=1e-5)
    headers = client.last_job.get()
    assert headers["X-Faas-Gpu-Unit"].startswith("cpu-") and headers["X-Faas-Gpu-Cache"] in ("hit", "miss")
    model(x)
    assert client.last_job.get()["X-Faas-Gpu-Cache"] == "hit"
    # state dicts still load as they are
    buf = io.BytesIO()
    torch.save(local.state_dict(), buf)
    buf.seek(0)
    assert isinstance(torch.load(buf, weights_only=True), dict)


def test_concurrent_calls_are_coalesced_into_batches(remote_env):
    torch.manual_seed(1)
    local = ResNetMini().eval()
    model = client.remote(local)
    xs = [torch.randn(1, 3, 32, 32) for _ in range(8)]
    outs, batches = [None] * 8, []

    def call(i):
        outs[i] = model(xs[i])
        batches.append(int(client.last_job.get()["X-Faas-Gpu-Batch"]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for x, y in zip(xs, outs, strict=True):
        assert torch.allclose(y, local(x), atol=1e-5)
    assert max(batches) > 1


def test_a_strict_batch_whose_slo_ran_out_in_the_instance_is_a_miss_not_run_or_retried(remote_env):
    """The client sends the budget left (from the call's arrival), not the whole SLO again; the
    scheduler reports the miss (504) without running it, and the client does not retry a miss."""
    import time

    import requests

    model = client.remote(ResNetMini().eval())
    x = torch.randn(1, 3, 32, 32)
    model(x)  # uploads the model: a cold start is not counted against a budget
    with pytest.raises(client.RemoteError, match="missed its deadline") as err:
        model._run(x, ("strict", 50.0, time.monotonic() - 1.0))  # arrived 1 s ago with a 50 ms SLO
    assert err.value.status == 504
    auth = {"Authorization": f"Bearer {client.read_token()}"}
    status = requests.get(f"{remote_env.url}/v1/status", headers=auth, timeout=10).json()
    assert status["late_dropped"] == 1 and status["deadline_misses"] == 1  # sent once, never run


def test_wrong_input_raises_the_models_message(remote_env):
    model = client.remote(ResNetMini())
    model(torch.randn(1, 3, 32, 32))  # exported at batch 1 ...
    assert model(torch.randn(3, 3, 32, 32)).shape == (3, 10)  # ... and still takes any batch
    with pytest.raises(client.RemoteError) as err:
        model(torch.randn(1, 5, 32, 32))
    assert err.value.status == 400


def test_without_a_scheduler_models_stay_local(monkeypatch, caplog):
    monkeypatch.delenv("FAAS_GPU_SCHEDULER_URL", raising=False)
    with caplog.at_level("WARNING"):
        assert client.install() is False
    assert "run locally on the CPU" in caplog.text
    m = ResNetMini()
    assert client.remote(m) is m
    client.uninstall()


def test_save_model_writes_a_program_with_a_dynamic_batch_the_managers_accept(tmp_path):
    from faas_gpu import save_model
    from faas_gpu.models.archive import Archive
    from faas_gpu.models.safe_formats import detect_format

    torch.manual_seed(3)
    local = ResNetMini().eval()
    path = save_model(local, torch.randn(1, 3, 32, 32), tmp_path / "model.pt2")
    with open(path, "rb") as fh:
        archive = Archive(fh)
        assert detect_format(archive) == "export" and archive.canonical  # kept as it is: its digest is its hash
    loaded = torch.export.load(path).module()
    for batch in (1, 5):
        x = torch.randn(batch, 3, 32, 32)
        assert torch.allclose(loaded(x), local(x), atol=1e-5)
    assert not local.training


def test_save_model_of_a_module_torch_export_cannot_convert_says_what_to_do(tmp_path):
    with pytest.raises(client.NotConvertible) as err:
        client.save_model(Branchy(), torch.ones(1, 3), tmp_path / "model.pt2")
    assert "Branchy" in str(err.value) and "torch.cond" in str(err.value) and "faas_gpu.remote" in str(err.value)
    assert not (tmp_path / "model.pt2").exists()


def test_export_load_gives_a_remote_program(remote_env, tmp_path):
    torch.manual_seed(2)
    local = ResNetMini().eval()
    x = torch.randn(2, 3, 32, 32)
    program = torch.export.export(local, (x,), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=64)},))
    torch.export.save(program, tmp_path / "model.pt2")
    assert client.install()
    remote_model = torch.export.load(str(tmp_path / "model.pt2")).module()
    assert isinstance(remote_model, client.RemoteModel)
    assert torch.allclose(remote_model(x), local(x), atol=1e-5)


def test_the_batch_queue_flushes_at_the_tightest_apps_timeout():
    """HarmonyBatch's per-app timeouts: a tight-SLO app's call does not wait for a loose one's."""
    from faas_gpu.client import BatchQueue, current_app

    batches: list[int] = []

    def run(x, _cls):
        batches.append(x.shape[0])
        return x * 2, {}

    q = BatchQueue(run, max_batch=8, timeout_s=30.0, timeouts={"loose": 30.0, "tight": 0.0})
    results: dict[str, torch.Tensor] = {}

    def call(app: str, value: float) -> None:
        current_app.set(app)
        results[app] = q(torch.full((1, 2), value))

    loose = threading.Thread(target=call, args=("loose", 1.0))
    loose.start()
    while not q._pending:  # the loose call is queued first
        pass
    tight = threading.Thread(target=call, args=("tight", 3.0))
    tight.start()
    tight.join(timeout=20)
    loose.join(timeout=20)
    assert not tight.is_alive() and not loose.is_alive()  # a 30 s timeout would still hold them
    assert batches == [2]
    assert results["tight"].tolist() == [[6.0, 6.0]] and results["loose"].tolist() == [[2.0, 2.0]]


def test_batches_waiting_for_a_slot_take_strict_calls_before_best_effort_ones():
    """Calls queued in the instance while its batches are all in flight keep PROTEAN's class order."""
    from faas_gpu.client import BatchQueue, request_class

    gate, started, order = threading.Event(), threading.Event(), []

    def run(x, cls):
        if not started.is_set():
            started.set()
            gate.wait(20)  # the first batch holds the only slot while the others queue
        order.append((cls[0], x[0, 0].item()))
        return x, {}

    q = BatchQueue(run, max_batch=1, timeout_s=0.0, max_inflight=1)

    def call(cls: str | None, value: float) -> None:
        request_class.set((cls, 100.0 if cls == "strict" else None))
        q(torch.full((1, 1), value))

    threads = [threading.Thread(target=call, args=(None, 0.0))]
    threads[0].start()
    assert started.wait(20)  # the first call runs, holding the slot
    for i, cls in enumerate(["best-effort", "best-effort", "strict", "best-effort", "strict"], start=1):
        t = threading.Thread(target=call, args=(cls, float(i)))
        t.start()
        threads.append(t)
        while len(q._pending) < i:  # queued in this order
            pass
    gate.set()
    for t in threads:
        t.join(timeout=20)
    assert [v for _, v in order] == [0.0, 3.0, 5.0, 1.0, 2.0, 4.0]


def test_app_timeouts_come_from_the_instance_env():
    from faas_gpu.client import LocalBatching

    b = LocalBatching.from_env({"FAAS_GPU_MAX_BATCH": "4", "FAAS_GPU_APP_TIMEOUTS_MS": "a=250, b=40.5"})
    assert b.max_batch == 4 and b.timeouts == {"a": 0.25, "b": 0.0405}
    assert LocalBatching.from_env({"FAAS_GPU_MAX_BATCH": "1"}) is None


class Branchy(torch.nn.Module):
    """Python control flow on a tensor's value: torch.export cannot convert it."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_a_pickled_module_that_cannot_be_exported_fails_at_the_handler_naming_what_to_do(remote_env, tmp_path):
    torch.save(Branchy(), tmp_path / "model.pt")
    assert client.install()
    model = torch.load(tmp_path / "model.pt", weights_only=False)  # the handler's own pickle, in its instance
    for _ in range(2):  # the second call fails at once, with the same message
        with pytest.raises(client.NotConvertible) as err:
            model(torch.ones(1, 3))
        message = str(err.value)
        assert "Branchy" in message and "never sent to the scheduler" in message
        assert (
            "torch.export.Dim('batch')" in message and "faas_gpu.remote(module)" in message and "TorchScript" in message
        )
    assert not any((tmp_path / "scheduler-models").glob("*.pt"))  # nothing was uploaded


def test_the_client_never_sends_a_pickle(remote_env, tmp_path):
    """Bytes the managers would refuse are the handler's error, before any request."""
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(3, 3), buf)
    model = client.RemoteModel(torch.nn.Linear(3, 3), client.ClientConfig.from_env(), artifact=buf.getvalue())
    with pytest.raises(client.NotConvertible, match="pickle is refused"):
        model(torch.ones(1, 3))
    assert not any((tmp_path / "scheduler-models").glob("*.pt"))


def test_a_batch_tells_the_scheduler_its_application_so_its_slo_counts_under_it(monkeypatch):
    """HarmonyBatch's app (X-Faas-Gpu-App at the instance) travels with the batch: the tightest
    call's app for a strict batch, else the first one named."""
    from faas_gpu.batching import _batch_class, _Call

    now = 100.0
    loose = _Call(torch.zeros(1), cls="strict", slo_ms=800.0, arrived=now, app="batch")
    tight = _Call(torch.zeros(1), cls="strict", slo_ms=100.0, arrived=now, app="feed")
    assert _batch_class([loose, tight]).app == "feed"
    assert _batch_class([_Call(torch.zeros(1)), _Call(torch.zeros(1), app="batch")]).app == "batch"
    assert _batch_class([_Call(torch.zeros(1))]).app is None

    model = client.RemoteModel(torch.nn.Identity(), client.ClientConfig(["http://127.0.0.1:9"], "t"))
    sent = {}
    monkeypatch.setattr(model, "_ensure_uploaded", lambda x: "digest")

    def request(method, path, budget=None, **kwargs):
        sent.update(kwargs["headers"])
        raise client.RemoteError(599, "captured")

    monkeypatch.setattr(model, "_request", request)
    with pytest.raises(client.RemoteError):
        model._run(torch.zeros(1, 2), _batch_class([loose, tight]))
    assert sent["X-Faas-Gpu-App"] == "feed" and sent["X-Faas-Gpu-Class"] == "strict"
    sent.clear()
    with pytest.raises(client.RemoteError):
        model._run(torch.zeros(1, 2))
    assert "X-Faas-Gpu-App" not in sent


def test_a_remote_models_batches_run_in_parallel_on_kept_flush_threads():
    """max_inflight > 1: batches run at once, each on a flush thread kept for the next batches
    (at most max_inflight of them), not on a thread started per batch."""
    from faas_gpu.client import BatchQueue

    running, most, lock = [0], [0], threading.Lock()
    threads: set[threading.Thread] = set()

    def run(x, _cls):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            threads.add(threading.current_thread())
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return x * 2, {}

    q = BatchQueue(run, max_batch=1, timeout_s=0.0, max_inflight=3)
    results: list[float] = []

    def call(value: float) -> None:
        results.append(q(torch.full((1, 1), value)).item())

    for _ in range(5):  # five rounds of six concurrent calls
        callers = [threading.Thread(target=call, args=(float(i),)) for i in range(6)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(timeout=20)
    assert sorted(results) == sorted([2.0 * i for i in range(6)] * 5)
    assert most[0] == 3  # in parallel, up to max_inflight
    assert len(threads) <= 3  # the same threads, round after round


class _NotLeader(BaseHTTPRequestHandler):
    """A scheduler that is not the leader (as every one is while etcd is down): 503, retry."""

    asked = 0

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).asked += 1
        body = b"not the scheduler leader; retry\n"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _stand_in_scheduler(handler: type[BaseHTTPRequestHandler]):
    """A scheduler stand-in served by `handler` on a port of its own: its URL, until the test ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def not_leader():
    _NotLeader.asked = 0
    yield from _stand_in_scheduler(_NotLeader)


def test_a_strict_batch_stops_retrying_when_its_budget_runs_out_with_no_scheduler_to_place_it(not_leader):
    """Found by the fault test under load: while etcd was down no scheduler was the leader, and a
    strict call kept retrying past its SLO until the watchdog timed it out (504, no reason)."""
    model = client.RemoteModel(torch.nn.Identity(), client.ClientConfig([not_leader], "t", retries=50))
    with pytest.raises(client.RemoteError) as err:
        model._request("POST", "/v1/jobs/d", client.Budget(150.0, time.monotonic()), data=b"x")
    assert err.value.status == 504 and "missed its deadline" in str(err.value), err.value
    assert "not the scheduler leader" in str(err.value)
    assert 1 <= _NotLeader.asked < 50  # the retries stopped with the budget, not at the count


def test_a_best_effort_batch_retries_to_the_count_while_no_scheduler_places_it(not_leader):
    model = client.RemoteModel(torch.nn.Identity(), client.ClientConfig([not_leader], "t", retries=3))
    with pytest.raises(client.RemoteError) as err:
        model._request("POST", "/v1/jobs/d", None, data=b"x")
    assert err.value.status == 503 and "no scheduler answered" in str(err.value)
    assert _NotLeader.asked == 3


class _SlowLeader(BaseHTTPRequestHandler):
    """A scheduler that takes the batch and answers after `delay_s` (a cold start's load, or one
    that hangs)."""

    delay_s = 0.0

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(type(self).delay_s)
        body = client.encode(torch.ones(1))
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_leader():
    yield from _stand_in_scheduler(_SlowLeader)


def test_a_strict_batch_is_not_waited_for_past_the_functions_timeout(slow_leader):
    """Found by the fault test under load: a strict call whose batch a scheduler had taken waited
    up to 300 s for it; the watchdog answered it 504 with no reason at its own timeout (30 s).
    Now the client gives up just before that timeout, with a 504 that says why."""
    _SlowLeader.delay_s = 10.0
    config = client.ClientConfig([slow_leader], "t", call_timeout_s=1.5)
    model = client.RemoteModel(torch.nn.Identity(), config)
    budget = client.Budget(200.0, time.monotonic())
    t0 = time.monotonic()
    with pytest.raises(client.RemoteError) as err:
        model._request("POST", "/v1/jobs/d", budget, model._give_up_at(budget), data=b"x")
    waited = time.monotonic() - t0
    assert err.value.status == 504 and "missed its deadline (200 ms)" in str(err.value), err.value
    assert "function's timeout (1.5s)" in str(err.value)
    assert 1.0 <= waited < 1.5  # before the watchdog's 1.5 s


def test_a_strict_batch_past_its_slo_but_within_the_functions_timeout_is_answered(slow_leader):
    """A cold start runs past the SLO (the scheduler runs a job it has started): its answer still
    counts while the function's timeout has not come."""
    _SlowLeader.delay_s = 0.6
    model = client.RemoteModel(torch.nn.Identity(), client.ClientConfig([slow_leader], "t", call_timeout_s=3.0))
    budget = client.Budget(100.0, time.monotonic())
    r = model._request("POST", "/v1/jobs/d", budget, model._give_up_at(budget), data=b"x")
    assert r.status_code == 200


def test_the_functions_timeout_comes_from_the_watchdogs_variable():
    base = {"FAAS_GPU_SCHEDULER_URL": "http://s:1"}
    assert client.ClientConfig.from_env(base).call_timeout_s == 30.0  # the watchdog's own default
    assert client.ClientConfig.from_env({**base, "exec_timeout": "1m30s"}).call_timeout_s == 90.0
    no_limit = client.ClientConfig([], "t", call_timeout_s=0)
    assert client.RemoteModel(torch.nn.Identity(), no_limit)._give_up_at(client.Budget(1.0, 0.0)) is None
